"""ASHA's rungs, and why it stopped a trial at one, in words.

Ray Tune's ASHAScheduler (one bracket) keeps, per milestone `min_steps x reduction_factor^k`,
the figure each trial had when it first reached it, and stops a trial whose figure is below
the (1 - 1/reduction_factor) quantile of the figures recorded there before it: the best
1/reduction_factor go on. The scheduler says only STOP; `Rungs` keeps the same record from the
same results, in the same order, so a stopped trial's child run can say at which rung, with
which figure, against which cutoff, and among how many. The milestones are computed as ASHA
computes them (its own float formula), so a trial validates exactly where ASHA decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def milestones(min_steps: int, full: int, reduction_factor: int) -> list[int]:
    """ASHA's milestones for grace period `min_steps` and max_t `full`, ascending (Ray's
    `_Bracket`: int(log(max_t / min_t) / log(rf) + 1) rungs from min_t up)."""
    count = int(np.log(full / min_steps) / np.log(reduction_factor) + 1)
    return [min_steps * reduction_factor ** k for k in range(count)]


def validation_steps(min_steps: int, full: int, reduction_factor: int) -> tuple[int, ...]:
    """Where a trial validates: every milestone below its full budget, and the end."""
    return tuple(sorted({m for m in milestones(min_steps, full, reduction_factor) if m < full}
                        | {full}))


@dataclass
class Rungs:
    """The figures each trial had at each milestone, as ASHA recorded them."""

    steps: list[int]
    reduction_factor: int
    lower_is_better: bool
    recorded: dict[int, dict[str, float]] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)
    """trial id -> the decision at its last rung ("continued" or the stop, in words)."""
    rung_of: dict[str, str] = field(default_factory=dict)
    """trial id -> its last rung: "rung 1 of 3 (step 16)"."""
    short: dict[str, str] = field(default_factory=dict)
    """trial id -> the decision at its last rung in a few words, for a narrow column:
    "stopped at step 16: 0.5123 < 0.5480" (the figure, then the cutoff)."""

    def observe(self, trial: str, step: int, value: float, metric: str) -> str | None:
        """A trial's figure at `step`: record it at the highest milestone it reached first, and
        say what ASHA decided there. Returns that decision in one short line for the console
        (`rung 1 of 3 (step 16): val/macro_f1 0.5123, cutoff 0.4800: promoted`), or None when
        `step` reached no new milestone."""
        signed = -value if self.lower_is_better else value
        for k, milestone in sorted(enumerate(self.steps), key=lambda m: -m[1]):
            seen = self.recorded.setdefault(milestone, {})
            if step < milestone or trial in seen:
                continue
            before = list(seen.values())
            cutoff = (float(np.nanpercentile(before, (1 - 1 / self.reduction_factor) * 100))
                      if before else None)
            seen[trial] = signed
            shown = -cutoff if (cutoff is not None and self.lower_is_better) else cutoff
            rung = f"rung {k + 1} of {len(self.steps)} (step {milestone})"
            self.rung_of[trial] = rung
            stopped = cutoff is not None and signed < cutoff
            sign = ("<" if not self.lower_is_better else ">") if stopped else \
                (">=" if not self.lower_is_better else "<=")
            self.short[trial] = (f"{'stopped' if stopped else 'went on'} at step {milestone}: "
                                 + (f"{value:.4f} {sign} {shown:.4f}" if cutoff is not None
                                    else f"{value:.4f}, the first there"))
            figure = f"{rung}: {metric} {value:.4f}, " + (
                f"cutoff {shown:.4f}" if cutoff is not None else "the first there")
            if stopped:
                self.said[trial] = (
                    f"stopped by ASHA at {rung}: {metric} {value:.4f} was "
                    f"{'above' if self.lower_is_better else 'below'} the cutoff {shown:.4f} "
                    f"(only the best 1/{self.reduction_factor} go on: the cutoff is that "
                    f"quantile of the {len(before)} trial(s) that reached step {milestone} "
                    "before it)")
            else:
                self.said[trial] = (f"continued at {rung}" + (
                    f": {metric} {value:.4f} against the cutoff {shown:.4f}"
                    if cutoff is not None else ": the first there"))
            return figure + (": stopped" if stopped else ": promoted")
        return None

    def state(self) -> dict:
        return {"recorded": {str(k): v for k, v in self.recorded.items()}, "said": self.said,
                "rung_of": self.rung_of, "short": self.short}

    def restore(self, state: dict) -> None:
        self.recorded = {int(k): dict(v) for k, v in state.get("recorded", {}).items()}
        self.said = dict(state.get("said", {}))
        self.rung_of = dict(state.get("rung_of", {}))
        self.short = dict(state.get("short", {}))
