"""The training state a checkpoint holds (train_state.json): where the run is, what it has
logged, and the best validation so far. One type for the loop, the checkpoints and the driver;
a plain dict only in the JSON file."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class Best:
    """The best validation so far (train/step/selection.py keeps it). The same on every rank: it is
    updated from validation figures that are already all-reduced."""

    metric: str
    """The validation key that ranks checkpoints (train.select_metric, auto resolved)."""
    step: int = 0
    """The step of the best validation so far (0 = none yet)."""
    value: float | None = None
    """Its figure."""
    rank: int = 0
    """How many improvements so far: the k-th new best has rank k."""
    since: int = 0
    """Validations since the best (early stopping counts these)."""


@dataclass
class TrainState:
    """Where a run is: the next batch of the sampler, the optimizer steps taken, the per-step
    history so far and the best validation."""

    best: Best
    epoch: int = 0
    index: int = 0
    """The next global batch inside `epoch` (the sampler resumes there)."""
    step: int = 0
    """Optimizer steps taken."""
    history: list[dict] = field(default_factory=list)
    """One record per step: loss, lr, grad norm, rows and tokens; validation figures where one
    ran."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict, metric: str | None = None) -> "TrainState":
        """A state read back; one from before best tracking (no record) gets a fresh `metric`
        record."""
        best = data.get("best")
        return cls(best=Best(**best) if best else Best(metric or ""),
                   epoch=data["epoch"], index=data["index"], step=data["step"],
                   history=list(data.get("history", [])))
