"""The label <-> id map and the checks on it: the order of the label names, what encoding a
split's labels can fail on, rows per label, and classes with a single train row."""

from __future__ import annotations

import numpy as np
import pandas as pd

from wellfed.config import number
from wellfed.data import markers
from wellfed.data.hashing import isin
from wellfed.data.scan import LabelCodes, Scan, labels_at
from wellfed.data.wording import SHOWN, plural


def label_names(train_labels: pd.Series, where: str, task: str = "single_label",
                targets: list | None = None) -> list[str]:
    """Stable label order: numeric order when every label is an integer, else sorted strings.
    Multi-label: every label any row holds; regression: the target column names."""
    if task == "regression":
        return [str(t) for t in targets or ["label"]]
    if task == "multi_label":
        values = sorted({p for v in train_labels for p in v})
    else:
        values = sorted(set(train_labels))
    if len(values) < 2:
        raise ValueError(f"{where}: train has a single class {values}; a classifier needs at "
                         "least two label values (check prepare.label_column)")
    try:
        return sorted(values, key=int)
    except ValueError:
        return values


def single_row_classes(train: pd.DataFrame, where: str) -> list[str]:
    counts = train["label"].value_counts()
    single = counts.index[counts == 1]
    if not len(single):
        return []
    rows = train.drop_duplicates("label").set_index("label")["row"] + 1
    shown = ", ".join(f"{label!r} (data row {rows[label]})" for label in single[:SHOWN])
    more = ", ..." if len(single) > SHOWN else ""
    return [f"{where}: {plural(len(single), 'class', 'classes')} with a single train row: "
            f"{shown}{more}; a model can hardly learn a class from one example and its scores "
            "mean little: check the label's spelling, add examples, or remove the row"]


def present_labels(scan: Scan, mask: np.ndarray, labels: LabelCodes) -> list:
    """The distinct labels of the rows in `mask` (classification)."""
    return [labels.values[c] for c in np.flatnonzero(np.bincount(scan.label[mask]))]


def check_labels(scan: Scan, mask: np.ndarray, names: list[str], labels: LabelCodes,
                  task: str, where: str, listed: list) -> None:
    """What encoding a split's labels can fail on: a label train never has (classification),
    a label that is not a number (regression). `listed`: prepare.missing_labels, for the fix
    when the label is a marker."""
    if task == "regression":
        bad = np.isnan(scan.targets[mask]).any(axis=1)
        if bad.any():
            first = np.flatnonzero(mask)[bad][0]
            label = labels_at(scan, [int(first)])[0]
            shown = label if isinstance(label, tuple) else (label,)
            raise ValueError(f"{where}: data row {int(scan.row[first]) + 1} has the label "
                             f"{shown[0] if len(shown) == 1 else shown!r}, not a number "
                             f"({int(bad.sum())} such row{'s' if bad.sum() > 1 else ''}); a "
                             "regression needs numeric labels: fix them, or set prepare.task"
                             + markers.hint(next((p for p in shown if number(p) is None),
                                                 shown[0]), listed))
        return
    multi = task == "multi_label"
    present = present_labels(scan, mask, labels)
    seen = {p for v in present for p in v} if multi else set(present)
    unknown = sorted(seen - set(names))
    if unknown:
        holds = [labels.codes[v] for v in present if (unknown[0] in v if multi
                                                      else v == unknown[0])]
        row = int(scan.row[np.flatnonzero(mask & isin(scan.label, np.array(holds)))[0]])
        shown = ", ".join(map(repr, names[:10])) + (f", ... ({len(names)} in all)"
                                                      if len(names) > 10 else "")
        others = f" and {plural(len(unknown) - 1, 'other label')}" if len(unknown) > 1 else ""
        raise ValueError(f"{where}: label {unknown[0]!r} (data row {row + 1}){others} never "
                         f"occurs in train (train labels: {shown}); fix the label or add train "
                         "examples" + markers.hint(unknown[0], listed))


def label_counts(scan: Scan, mask: np.ndarray, names: list[str], labels: LabelCodes,
                  task: str) -> dict:
    """Rows per class (multi-label: rows holding each label); regression: each target's
    mean, sd, min and max."""
    if task == "regression":
        values = scan.targets[mask] if mask.any() else np.zeros((0, len(names)))
        return {name: {"mean": round(float(v.mean()), 4), "sd": round(float(v.std()), 4),
                       "min": float(v.min()), "max": float(v.max())}
                for name, v in zip(names, values.T)}
    rows = np.bincount(scan.label[mask], minlength=len(labels.values))
    counts: dict = {}
    for code in np.flatnonzero(rows):
        value = labels.values[code]
        for name in (value if task == "multi_label" else (value,)):
            counts[name] = counts.get(name, 0) + int(rows[code])
    return {name: counts.get(name, 0) for name in names}
