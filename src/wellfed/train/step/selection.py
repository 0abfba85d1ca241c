"""Best checkpoint and early stopping: which validation figure ranks the checkpoints, which way
is better, and the best-so-far record that lives in the training state (so a resume keeps it).

The record, `TrainState.best` (train/checkpoints/state.py: `Best`), is the same on every rank: it is
updated from validation figures that are already all-reduced, so every rank checkpoints and stops at
the same step.

Checkpoints report `rank` as RANK_KEY when their validation is a new best, else 0. The store keeps
the highest-ranked checkpoint (train/checkpoints/store.py, its manifest's `rank`), so "the best" is
decided here once, by strict improvement, and never by comparing floats later: a tie is not an
improvement, so the earliest of equal figures stays the best, and a non-finite figure never becomes
it.
"""

from __future__ import annotations

import math

from wellfed import tasks
from wellfed.train.checkpoints.state import Best

LOWER_IS_BETTER = ("val/loss", "val/mse")
"""Validation figures where smaller is better; every other val/* figure is higher-is-better."""
RANK_KEY = "select_rank"
"""The key a checkpoint's report carries its rank under (Ray's checkpoint_score_attribute)."""


def val_keys(task: str) -> tuple[str, ...]:
    """The validation figures `task` reports, from the function that computes them (figures of an
    empty batch: the keys do not depend on the numbers)."""
    import torch

    k = 2
    labels = (torch.zeros(0, dtype=torch.long) if task == "single_label"
              else torch.zeros((0, k)))
    return tuple(sorted(tasks.val_metrics(task, tasks.val_stats(
        task, torch.zeros((0, k)), labels).tolist(), k)))


def resolve(select_metric: str, task: str) -> str:
    """`train.select_metric` as a validation key of `task`; ValueError in one line otherwise."""
    key = tasks.HEADLINE[task] if select_metric == "auto" else select_metric
    allowed = val_keys(task)
    if key not in allowed:
        raise ValueError(f"train.select_metric {select_metric!r} is not a validation figure of "
                         f"this {task} task (data/tokens/meta.json); use auto "
                         f"({tasks.HEADLINE[task]}) or one of {', '.join(allowed)}")
    return key


def fresh(metric: str) -> Best:
    """The best-so-far record of a run that has not validated yet."""
    return Best(metric)


def improves(value: float, best: float | None, metric: str) -> bool:
    """Strictly better than `best` (None: nothing yet); NaN and inf never improve."""
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    return value < best if metric in LOWER_IS_BETTER else value > best


def observe(best: Best, figures: dict[str, float], step: int) -> bool:
    """Update the record `best` in place with one validation at `step`; return whether it is a
    new best."""
    value = figures[best.metric]
    if improves(value, best.value, best.metric):
        best.step, best.value, best.rank, best.since = step, value, best.rank + 1, 0
        return True
    best.since += 1
    return False


def stop_line(best: Best, step: int) -> str:
    """The line rank 0 prints when early stopping ends the run."""
    value = "nothing yet" if best.value is None else f"{best.value:.4f} (step {best.step})"
    return (f"[wellfed] early stop at step {step}: {best.metric} has not improved on {value} "
            f"for {best.since} validations")
