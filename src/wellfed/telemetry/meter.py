"""Step meter: where one worker's time went in one report interval, and how useful it was.

Input wait and host-to-device copy are host wall time around the fetch and the copy. Compute is
measured with CUDA events on GPUs (read at report time, when the report's all-reduce has
already synchronised the stream, so the step itself gains no extra sync), and as the rest of
the wall time on CPU. MFU counts useful work only: real (non-pad) tokens x training FLOPs per
token, over wall time, over the device peak.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable

import torch

from wellfed.model import flops_per_token
from wellfed.telemetry.peak import Peak, guard

log = logging.getLogger(__name__)


class StepMeter:
    def __init__(self, device: torch.device, peak: Peak, model_config,
                 clock: Callable[[], float] = time.perf_counter):
        self.cuda = device.type == "cuda"
        self.peak, self.model_config = peak, model_config
        self.now = clock
        """Host seconds from some start: perf_counter; a test's own clock (one its stand-in
        loader and step advance) makes the shares exact whatever the machine's load."""
        self.warned = False
        self.reset()

    def reset(self) -> None:
        self.started = self.now()
        self.input_wait = self.copy = 0.0
        self.rows = self.real = self.padded = 0
        self._events: list[tuple] = []

    @contextlib.contextmanager
    def waiting(self):
        start = self.now()
        yield
        self.input_wait += self.now() - start

    @contextlib.contextmanager
    def copying(self):
        start = self.now()
        yield
        self.copy += self.now() - start

    @contextlib.contextmanager
    def computing(self):
        if not self.cuda:
            yield
            return
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        yield
        end.record()
        self._events.append((begin, end))

    def count(self, rows: int, real: int, padded: int) -> None:
        self.rows += rows
        self.real += real
        self.padded += padded

    def interval(self) -> dict[str, float]:
        """This worker's figures since the last reset (call right after the report's all-reduce)."""
        elapsed = max(self.now() - self.started, 1e-9)
        if self.cuda:
            compute = sum(b.elapsed_time(e) for b, e in self._events) / 1000.0
        else:
            compute = max(elapsed - self.input_wait - self.copy, 0.0)
        seq = self.padded / self.rows if self.rows else 1.0
        # All the FLOPs computed (padding included) bound what the device achieved; MFU counts
        # the useful (real-token) part of it.
        achieved = self.padded * flops_per_token(self.model_config, seq) / elapsed
        self.peak, exceeded = guard(self.peak, achieved)
        if exceeded and not self.warned:
            self.warned = True
            log.warning("the device ran %.3g TFLOP/s, above its peak estimate; MFU is now "
                        "measured against %s", achieved / 1e12, self.peak.source)
        useful = self.real * flops_per_token(self.model_config, seq)
        return {"interval_s": elapsed, "input_wait_s": self.input_wait, "copy_s": self.copy,
                "compute_s": compute, "input_wait_share": self.input_wait / elapsed,
                "local_rows": self.rows, "local_real_tokens": self.real,
                "local_padded_tokens": self.padded,
                "mfu": min(useful / elapsed / self.peak.flops, 1.0) if self.peak.flops else 0.0}
