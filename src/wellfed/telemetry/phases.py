"""Where a stage's wall time goes: named phases timed with a context manager, one line printed.

The train stage's time on a small job is mostly not training (issue: 56 s for 2,048 rows of
which ~21 s were steps). `Phases` sums the wall time of each named part; the loop keeps its own
(model load, steps, validation, checkpoints, reports) and sends them with every report, so the driver can
show them next to its own (Ray start and stop, export, MLflow) in one breakdown.
"""

from __future__ import annotations

import contextlib
import time


class Phases:
    """Seconds per named phase, in the order first seen; a phase timed twice adds up."""

    def __init__(self, seconds: dict[str, float] | None = None):
        self.seconds: dict[str, float] = dict(seconds or {})

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def total(self) -> float:
        return sum(self.seconds.values())


def breakdown(total: float, parts: dict[str, float], steps: str = "steps") -> str:
    """'train stage 56.3 s: steps 21.0 (37%), ray start 4.1, ... ; fixed cost 35.3 s' where
    the fixed cost is everything but `steps`, and what no phase covers is shown as 'other'."""
    other = total - sum(parts.values())
    shown = {**parts, **({"other": other} if other > 0.05 else {})}
    fixed = total - parts.get(steps, 0.0)
    text = ", ".join(f"{name} {secs:.1f}" for name, secs in
                     sorted(shown.items(), key=lambda kv: -kv[1]) if secs >= 0.05)
    return f"{total:.1f} s: {text}; fixed cost (all but {steps}) {fixed:.1f} s"


def split_train(seconds: dict[str, float], worker: dict[str, float]) -> dict[str, float]:
    """The driver's phases with its "train" phase replaced by the worker's own parts (setup,
    steps, validation...) and what was spent around them: on Ray Train (the driver has a "ray
    start" phase) its controller and worker start and stop and the last report."""
    parts = {k: v for k, v in seconds.items() if k != "train"}
    parts.update(worker)
    around = "ray train start/stop" if "ray start" in seconds else "train start/stop"
    parts[around] = max(seconds.get("train", 0.0) - sum(worker.values()), 0.0)
    return parts


def stage_breakdown(clock: Phases, started: float, uri: str, run_id: str) -> str:
    """The train stage's wall time since `started` (time.time()) in parts, "train" split by the
    worker's own seconds (the run tag tracking.WORKER_TIME, rank 0's at its last report);
    logged to the run as time/stage_s and time/fixed_s too."""
    import json

    import mlflow

    from wellfed.track import tracking

    tag = mlflow.MlflowClient(uri).get_run(run_id).data.tags.get(tracking.WORKER_TIME)
    record = json.loads(tag) if tag else {}
    # This attempt's reports only: a resumed run's tag may be the interrupted attempt's.
    worker = record.get("seconds", {}) if record.get("at", 0) >= started else {}
    total = time.time() - started
    tracking.log_metrics(uri, run_id, {"time/stage_s": total,
                                       "time/fixed_s": total - worker.get("steps", 0.0)})
    return breakdown(total, split_train(clock.seconds, worker))
