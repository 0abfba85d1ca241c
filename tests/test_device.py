import pytest
import torch

from wellfed import device as dev


def test_auto_precision_on_cpu_is_fp32_and_says_why():
    p = dev.choose_precision("auto", torch.device("cpu"))
    assert p.name == "fp32" and "CPU" in p.reason and p.dtype is None and not p.needs_scaler


def test_fp16_on_cpu_is_refused_and_bf16_is_allowed_when_asked():
    with pytest.raises(ValueError, match="fp16 needs a CUDA GPU"):
        dev.choose_precision("fp16", torch.device("cpu"))
    assert dev.choose_precision("bf16", torch.device("cpu")).dtype == torch.bfloat16


def test_cuda_table(monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    p = dev.choose_precision("auto", cuda)
    assert p.name == "fp16" and p.needs_scaler
    with pytest.raises(ValueError, match="does not support bf16"):
        dev.choose_precision("bf16", cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert dev.choose_precision("auto", cuda).name == "bf16"


def test_pad_multiple_per_device():
    assert dev.pad_multiple(0, torch.device("cpu")) == 1
    assert dev.pad_multiple(0, torch.device("cuda", 0)) == 8
    assert dev.pad_multiple(16, torch.device("cpu")) == 16
