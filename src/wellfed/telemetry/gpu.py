"""Per-worker device sampler: a background NVML thread on GPUs, process CPU figures elsewhere.

Each worker samples only its own device every `interval_s` and `snapshot()` returns the means
since the previous snapshot (one report interval). It never raises into the training loop: if
NVML is missing or fails, it says so once and falls back to CPU figures.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict

import psutil
import torch

log = logging.getLogger(__name__)


def nvml_handle(device: torch.device):
    """The NVML handle of this process's CUDA device, matched by UUID so that Ray's
    CUDA_VISIBLE_DEVICES remapping cannot point us at a neighbour's GPU."""
    import pynvml

    pynvml.nvmlInit()
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except pynvml.NVMLError:
        return pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def read_nvml(handle) -> dict[str, float]:
    import pynvml

    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return {"gpu_util_pct": float(util.gpu),
            "gpu_mem_used_gb": mem.used / 2**30, "gpu_mem_total_gb": mem.total / 2**30,
            "gpu_power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "gpu_temp_c": float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            "gpu_sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))}


class DeviceSampler:
    """Samples in a daemon thread; `snapshot()` -> mean of each figure since the last call."""

    def __init__(self, device: torch.device, interval_s: float = 0.5):
        self.device, self.interval_s = device, interval_s
        self.kind = "cpu"
        self._process = psutil.Process(os.getpid())
        self._process.cpu_percent(None)  # prime: the first call always returns 0
        self._handle = None
        if device.type == "cuda":
            try:
                self._handle = nvml_handle(device)
                self.kind = "gpu"
            except Exception as err:  # NVML absent or broken: keep training, say it once
                log.warning("GPU telemetry off (NVML unavailable: %s); recording CPU figures", err)
        self._sums: dict[str, float] = defaultdict(float)
        self._count = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wellfed-sampler", daemon=True)

    def start(self) -> "DeviceSampler":
        self._thread.start()
        return self

    def read(self) -> dict[str, float]:
        if self._handle is not None:
            try:
                return read_nvml(self._handle)
            except Exception as err:
                log.warning("NVML read failed (%s); recording CPU figures from now on", err)
                self._handle, self.kind = None, "cpu"
        return {"cpu_util_pct": self._process.cpu_percent(None),
                "cpu_rss_gb": self._process.memory_info().rss / 2**30}

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            sample = self.read()
            with self._lock:
                for key, value in sample.items():
                    self._sums[key] += value
                self._count += 1

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            sums, count = dict(self._sums), self._count
            self._sums.clear()
            self._count = 0
        if not count:
            sums, count = self.read(), 1
        out = {k: v / count for k, v in sums.items()}
        if self.device.type == "cuda":
            out["torch_max_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return out

    def stop(self) -> None:
        self._stop.set()
