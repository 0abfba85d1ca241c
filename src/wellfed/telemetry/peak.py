"""Device peak FLOP/s for MFU: a table of known GPUs, else a short matmul measurement.

Table values are vendor dense (no sparsity) tensor-core peaks in TFLOP/s. fp32 uses the plain
fp32 peak (TF32 is not assumed, since torch leaves it off for matmuls by default).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# name fragment -> {precision: dense TFLOP/s}; the first fragment found in the device name wins.
KNOWN_GPUS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "fp32": 31.2}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    ("T4", {"fp16": 65.0, "fp32": 8.1}),
]


@dataclass(frozen=True)
class Peak:
    flops: float
    """Peak FLOP/s used as the MFU denominator."""
    source: str
    """How it was obtained: 'table:<name>' or 'measured:<how>'."""


def table_peak(device_name: str, precision: str) -> Peak | None:
    for fragment, peaks in KNOWN_GPUS:
        if fragment.lower() in device_name.lower() and precision in peaks:
            return Peak(peaks[precision] * 1e12, f"table:{fragment} {precision}")
    return None


def measure_peak(device: torch.device, dtype: torch.dtype | None, seconds: float = 0.3,
                 size: int = 1024) -> Peak:
    """Best matmul FLOP/s over ~`seconds` with the worker's own threads: an achievable peak."""
    dtype = dtype or torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b  # warm up kernels / thread pool
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        (a @ b).sum().item()  # .item() syncs the device: the measurement is real
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    name = str(dtype).removeprefix("torch.")
    return Peak(best, f"measured:{size}x{size} {name} matmul on {device.type}")


def device_peak(device: torch.device, device_name: str, precision: str,
                dtype: torch.dtype | None) -> Peak:
    if device.type == "cuda":
        known = table_peak(device_name, precision)
        if known:
            return known
    return measure_peak(device, dtype)
