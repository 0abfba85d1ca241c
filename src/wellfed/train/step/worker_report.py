"""What a worker reports every `report_every` steps (and at every validation and checkpoint):
built typed in the loop, a dict only where it leaves the loop for its sink (`as_dict`:
ray.train.report on Ray, the in-process sink otherwise), flat, under the keys the driver's
callback and tracking read."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from wellfed.train.step.selection import RANK_KEY


@dataclass(frozen=True)
class WorkerFacts:
    """A worker's choices, fixed for the run: where it runs and how."""

    rank: int
    steps_total: int
    precision: str
    precision_reason: str
    pad_multiple: int
    device: str
    node: str
    peak_flops: float
    peak_source: str


@dataclass(frozen=True)
class WorkerReport:
    facts: WorkerFacts
    run: dict
    """setup.run_facts: the token budget (a halving changes it) and the step's path."""
    records: list[dict]
    """One per step since the last report: loss, lr, grad norm, rows, tokens."""
    interval: dict
    """StepMeter.interval(): seconds waiting, copying and computing, tokens, MFU."""
    telemetry: dict
    """The device sampler's means since the last report (NVML, else the process's CPU)."""
    sampler: str
    timing: dict
    """This attempt's seconds so far in setup, steps, validation, checkpoints, reports."""
    val: dict | None = None
    """The validation figures, when this report closes a validation."""
    select_rank: int | None = None
    """With a checkpoint: its rank (train/step/selection.py), 0 when it is not a new best."""

    def as_dict(self) -> dict:
        out = {**dataclasses.asdict(self.facts), **self.run, "records": self.records,
               **self.interval, "telemetry": self.telemetry, "sampler": self.sampler,
               "timing": self.timing}
        if self.val is not None:
            out["val"] = self.val
        if self.select_rank is not None:
            out[RANK_KEY] = self.select_rank
        return out
