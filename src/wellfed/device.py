"""Device and precision, decided once from a small table; the host-to-device copy and autocast.
(Telemetry reads torch.cuda for its own figures: CUDA events, NVML, peak memory.)

| device               | auto precision | why                                                  |
|----------------------|----------------|------------------------------------------------------|
| CUDA, bf16-capable   | bf16           | Ampere+; no loss scaling needed                      |
| CUDA, older (V100,T4)| fp16 + scaler  | tensor cores, GradScaler guards underflow            |
| CPU                  | fp32           | bf16 autocast measured 2.7x slower on this CPU       |
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    name: str  # bf16 | fp16 | fp32
    reason: str

    @property
    def dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)

    @property
    def needs_scaler(self) -> bool:
        return self.name == "fp16"


def cuda_available() -> bool:
    return torch.cuda.is_available()


def gpu_count() -> int:
    return torch.cuda.device_count()


def use_device(device: torch.device) -> None:
    """Make `device` (a CUDA device) the current one, for the libraries that use the default."""
    torch.cuda.set_device(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine() or "cpu"


def choose_precision(requested: str, device: torch.device) -> Precision:
    """Resolve `train.precision` for `device`; raise a clear error when it cannot be done."""
    if device.type == "cuda":
        bf16_ok = torch.cuda.is_bf16_supported()
        if requested == "auto":
            if bf16_ok:
                return Precision("bf16", f"auto: {device_name(device)} supports bf16")
            return Precision("fp16", f"auto: {device_name(device)} has no bf16; fp16 + GradScaler")
        if requested == "bf16" and not bf16_ok:
            raise ValueError(f"train.precision bf16: {device_name(device)} does not support bf16; "
                             "use fp16 or auto")
        return Precision(requested, "set in params")
    if requested == "auto":
        return Precision("fp32", "auto: CPU, where bf16 autocast is measured 2.7x slower")
    if requested == "fp16":
        raise ValueError("train.precision fp16 needs a CUDA GPU; use auto, fp32 or bf16 on CPU")
    return Precision(requested, "set in params")


def autocast(device: torch.device, precision: Precision, cache: bool = True):
    """Mixed precision for `precision`; `cache=False` under CUDA graph capture, where PyTorch's
    guide says autocast must not keep its cast weights between captures."""
    if precision.dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=precision.dtype, cache_enabled=cache)


def grad_scaler(device: torch.device, precision: Precision):
    """A GradScaler for fp16 on CUDA, else a disabled one (its calls become no-ops)."""
    return torch.amp.GradScaler(device.type, enabled=precision.needs_scaler)


def pad_multiple(requested: int, device: torch.device) -> int:
    """0 = per device: 8 on CUDA (tensor-core tiles), 1 on CPU (padding to 8 cost ~15% on SST-2)."""
    if requested:
        return requested
    return 8 if device.type == "cuda" else 1


def to_device(batch: dict, device: torch.device) -> dict:
    """Host numpy batch -> device tensors; pinned memory + non_blocking copies on CUDA."""
    out = {}
    for key, value in batch.items():
        tensor = torch.as_tensor(value)
        if device.type == "cuda":
            if not tensor.is_pinned():  # a DataLoader with pin_memory=True pinned it already
                tensor = tensor.pin_memory()
            tensor = tensor.to(device, non_blocking=True)
        out[key] = tensor
    return out


def forward(model, batch: dict, host: dict, keep_mask: bool = False):
    """Logits for a batch. A batch without padding is passed with no attention mask: the same
    function, but attention then takes PyTorch's unmasked SDPA path, measured here at 0.67x the
    time of the masked one for MiniLM fwd+bwd on 32x14 tokens. `host` is the CPU copy, so the
    check costs no device sync. `keep_mask` always passes it (a torch.compile'd model: a mask
    that comes and goes would be a second family of graphs to compile; on an H100 the unmasked
    dynamic-width graph stalled inductor for over 7 minutes)."""
    padded = keep_mask or not bool(host["attention_mask"].all())
    types = {"token_type_ids": batch["token_type_ids"]} if "token_type_ids" in batch else {}
    return model(input_ids=batch["input_ids"],
                 attention_mask=batch["attention_mask"] if padded else None, **types).logits


def forward_planned(model, batch: dict, full_mask: bool):
    """Logits for a micro-batch of the shape plan: always with its mask (a shape is one graph), as a
    prepared (rows, 1, 1, width) boolean mask when `full_mask` (train/step/graphs.py checks that the
    model takes it): transformers then hands it to attention as it is, instead of reading the mask
    on the host to see whether it could be dropped, a sync in every forward."""
    mask = batch["attention_mask"]
    if full_mask:
        mask = mask.bool()[:, None, None, :]
    types = {"token_type_ids": batch["token_type_ids"]} if "token_type_ids" in batch else {}
    return model(input_ids=batch["input_ids"], attention_mask=mask, **types).logits
