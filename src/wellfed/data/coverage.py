"""Whether a validation or test split can judge a model: more than one class, and enough rows of
every class.

Validation picks the exported checkpoint (train.select: best, by the task's headline, e.g.
val/macro_f1) and fits the calibration temperature; test ranks models (evaluate, the champion
alias). A split with one class can do neither: macro-F1 over one class rewards predicting it
everywhere, and a temperature fitted on it learns nothing about the others (seen: T = 20 fitted
on a one-class validation split took test ECE from 0.0102 to 0.0290), so calibration is not
applied there (evaluate/temperature.py). A class with fewer than MIN_ROWS rows, or none, leaves
the ranking to a few rows: one row of a 4-row class moves that class's F1 by up to 0.25 and the
macro-F1 by 0.25 / classes. Multi-label counts the rows holding each label; regression needs a
target that varies (Pearson's r is undefined on a constant).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wellfed.data.wording import SHOWN, plural

MIN_ROWS = 5
"""Rows of each class (multi-label: of each label) a split needs to rank models."""

FIXES = {
    "validation": ("give prepare.validation a file with every class, or set it to \"\" to carve "
                   "a stratified prepare.val_fraction of train (raise it for more rows)"),
    "test": ("give prepare.test a file with every class, or set it to \"\" to evaluate on "
             "validation"),
}


@dataclass(frozen=True)
class Gap:
    """Why a split cannot judge (`one_class`: at all; else: not reliably)."""

    split: str
    problem: str
    one_class: bool

    def warning(self, where: str) -> str:
        """The one line: the split (and its file), what is wrong, what it costs, the fix."""
        cost = ("checkpoint selection on it is blind and calibration is not applied"
                if self.split == "validation" else "evaluate's figures on it rank nothing")
        if not self.one_class:
            cost = ("ranking checkpoints or models on it rides on a few rows"
                    if self.split == "validation" else "evaluate's figures on it are noisy")
        return f"{self.split} split ({where}) {self.problem}: {cost}; {FIXES.get(self.split, '')}"


def counts(task: str, labels, names: list[str]) -> dict:
    """A split's label counts, as prepare's report keeps them, from its label array (a token
    file's): rows per class; multi-label: rows holding each label; regression: each target's
    spread (`sd`)."""
    labels = np.asarray(labels)
    if task == "regression":
        values = labels.reshape(len(labels), -1)
        return {name: {"sd": float(values[:, i].std()) if len(values) else 0.0}
                for i, name in enumerate(names)}
    if task == "multi_label":
        per_label = labels.reshape(len(labels), -1).sum(0) if len(labels) else [0] * len(names)
        return {name: int(n) for name, n in zip(names, per_label)}
    found = np.bincount(labels.astype(np.int64), minlength=len(names)) if len(labels) else []
    return {name: int(n) for name, n in zip(names, found)}


def gap(split: str, task: str, label_counts: dict) -> Gap | None:
    """What keeps `split` (its counts as `counts` or prepare's report give them) from judging
    a model; None when nothing does."""
    if task == "regression":
        flat = [name for name, stats in label_counts.items() if not stats.get("sd")]
        if not flat:
            return None
        return Gap(split, f"has a constant target ({', '.join(flat)}): Pearson's r is undefined "
                          "on it", True)
    present = {name: n for name, n in label_counts.items() if n}
    kind = "label" if task == "multi_label" else "class"
    if len(present) < 2:
        what = ", ".join(f"{name}: {plural(n, 'row')}" for name, n in present.items()) or "none"
        return Gap(split, f"has {'one' if present else 'no'} {kind} ({what})", True)
    thin = sorted((n, name) for name, n in label_counts.items() if n < MIN_ROWS)
    if not thin:
        return None
    shown = ", ".join(f"{name} {n}" for n, name in thin[:SHOWN]) + (", ..." if len(thin) > SHOWN
                                                                     else "")
    kinds = plural(len(thin), kind, kind + ("es" if kind == "class" else "s"))
    return Gap(split, f"has fewer than {MIN_ROWS} rows of {kinds} ({shown})", False)
