"""Where a stage's wall time goes: named phases timed with a context manager.

`Phases` sums the wall time of each named part. A stage's budget (telemetry/budget.py) is one;
the training loop keeps its own (model load, steps, validation, checkpoints, reports) and sends
them with every report, so the train stage shows them next to its own (MLflow, export, Ray start
and stop) in one budget (`split_train`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable


class Phases:
    """Seconds per named phase, in the order first seen; a phase timed twice adds up."""

    def __init__(self, seconds: dict[str, float] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.seconds: dict[str, float] = dict(seconds or {})
        self.now = clock
        """Seconds from some start: perf_counter; a test's own clock makes its sums exact."""

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = self.now()
        try:
            yield
        finally:
            self.add(name, self.now() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def total(self) -> float:
        return sum(self.seconds.values())


def split_train(seconds: dict[str, float], worker: dict[str, float]) -> dict[str, float]:
    """The driver's phases with its "train" phase replaced by the worker's own parts (setup,
    steps, validation...) and what was spent around them: on Ray Train (the driver has a "ray
    start" phase) its controller and worker start and stop and the last report."""
    parts = {k: v for k, v in seconds.items() if k != "train"}
    parts.update(worker)
    around = "ray train start/stop" if "ray start" in seconds else "train start/stop"
    parts[around] = max(seconds.get("train", 0.0) - sum(worker.values()), 0.0)
    return parts
