"""Device peak FLOP/s for MFU: a table of known GPUs, else a measured estimate (cached).

Table values are vendor dense (no sparsity) tensor-core peaks in TFLOP/s. fp32 uses the plain
fp32 peak (TF32 is not assumed, since torch leaves it off for matmuls by default).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

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
    """How it was obtained: 'table:<name> <precision>' or 'estimate:<how>'."""


def table_peak(device_name: str, precision: str) -> Peak | None:
    for fragment, peaks in KNOWN_GPUS:
        if fragment.lower() in device_name.lower() and precision in peaks:
            return Peak(peaks[precision] * 1e12, f"table:{fragment} {precision}")
    return None


def measure_peak(device: torch.device, dtype: torch.dtype | None, size: int = 2048,
                 repeats: int = 5) -> Peak:
    """Best of `repeats` timed `size`^3 matmuls with the worker's own threads: an achievable peak.
    Larger than one 1024^2 product and best of several, because a single short product under
    load read 0.054 TFLOP/s on this 2-core CPU where a longer one reaches ~0.25 (MFU was then
    overstated 1.5-5x)."""
    dtype = dtype or torch.float32
    # Its own generator: the global one seeds the training's dropout, which must not depend on
    # whether (or how often) the peak was measured.
    gen = torch.Generator(device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    (a @ b).sum().item()  # warm up kernels / thread pool
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        (a @ b).sum().item()  # .item() syncs the device: the measurement is real
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    name = str(dtype).removeprefix("torch.")
    return Peak(best, f"estimate:best of {repeats} {size}x{size} {name} matmuls on {device.type}, "
                      f"{torch.get_num_threads()} threads")


def cached_peak(device: torch.device, device_name: str, dtype: torch.dtype | None,
                cache: Path | None = None) -> Peak:
    """The best measure_peak seen on this machine, thread count, dtype and torch version: every
    run measures again and the cache (JSON under $WELLFED_CACHE, default ~/.cache/wellfed)
    keeps the maximum. One measurement under load read 0.024 TFLOP/s here and, cached as it
    was, made every later run's MFU read 3x too high; a maximum only climbs towards what the
    quiet machine does. The first run takes the best of 5 (0.8 s on this CPU); with a cached
    best, one product (0.2 s) is enough to keep climbing."""
    import platform

    key = json.dumps([device.type, device_name, platform.machine(), torch.get_num_threads(),
                      str(dtype), torch.__version__])
    path = (cache or cache_dir()) / f"peak-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    try:
        saved = json.loads(path.read_text())
        saved = Peak(float(saved["flops"]), str(saved["source"]))
    except (OSError, ValueError, KeyError, TypeError):
        saved = None  # none yet, or unreadable: measured afresh and rewritten
    if saved is None:
        peak = measure_peak(device, dtype)
    else:  # one product; a new best keeps the description of how bests are measured
        peak = Peak(measure_peak(device, dtype, repeats=1).flops, saved.source)
        if saved.flops >= peak.flops:
            return Peak(saved.flops, saved.source + " (best on this machine)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"flops": peak.flops, "source": peak.source, "key": key}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: measure again next time
    return peak


def cache_dir() -> Path:
    return Path(os.environ.get("WELLFED_CACHE", Path.home() / ".cache" / "wellfed"))


_IN_PROCESS: dict[tuple, Peak] = {}
"""Peaks this process measured already: a warm search worker trains trial after trial, and one
product per trial (0.2 s here idle, 1.5 s under load) was most of a warm trial's setup."""


def device_peak(device: torch.device, device_name: str, precision: str,
                dtype: torch.dtype | None) -> Peak:
    """The MFU denominator: the table on known GPUs, else a cached measured estimate (measured
    once per process)."""
    if device.type == "cuda":
        known = table_peak(device_name, precision)
        if known:
            return known
    key = (str(device), device_name, str(dtype), torch.get_num_threads())
    if key not in _IN_PROCESS:
        _IN_PROCESS[key] = cached_peak(device, device_name, dtype)
    return _IN_PROCESS[key]


def guard(peak: Peak, achieved: float) -> tuple[Peak, bool]:
    """MFU can never exceed 1. A measured estimate below what the device just achieved was
    taken under load: raise it to the achieved rate. A table peak exceeded means the FLOP count
    is wrong: keep the peak (MFU is then capped at 1). Returns (peak, whether it was exceeded)."""
    if achieved <= peak.flops:
        return peak, False
    if peak.source.startswith("table:"):
        return peak, True
    source = peak.source.split(" -> ")[0]
    return Peak(achieved, f"{source} -> raised to {achieved / 1e12:.3g} TFLOP/s achieved in training"), True
