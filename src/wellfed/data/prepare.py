"""Pure preparation: clean each split, build the label <-> id map, carve a stratified validation.

Nothing is dropped silently: every removed row is counted per reason in the report, and with
`on_invalid: error` the first bad row stops the stage with its file and row named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split

from wellfed.config import PrepareConfig


@dataclass
class SplitReport:
    rows_read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {
        "empty_text": 0, "missing_label": 0, "duplicate": 0})
    duplicates_found: int = 0
    labels: dict[str, int] = field(default_factory=dict)


def clean(frame: pd.DataFrame, where: str, cfg: PrepareConfig) -> tuple[pd.DataFrame, SplitReport]:
    """Drop (or reject) empty texts and missing labels; count and optionally drop duplicates."""
    report = SplitReport(rows_read=len(frame))
    if frame.empty:
        raise ValueError(f"{where}: has a header but no data rows; add rows or fix the path")
    empty = frame["text"].isna() | (frame["text"].fillna("").str.strip() == "")
    missing = frame["label"].isna() & ~empty
    for mask, reason, fix in ((empty, "empty_text", "fill in the text"),
                              (missing, "missing_label", "add the label")):
        if mask.any() and cfg.on_invalid == "error":
            row = int(frame.loc[mask, "row"].iloc[0])
            raise ValueError(f"{where}: data row {row + 1} has {reason.replace('_', ' ')} "
                             f"({int(mask.sum())} such rows); {fix}, or set "
                             f"prepare.on_invalid: skip to drop and count them")
        report.dropped[reason] = int(mask.sum())
    frame = frame[~(empty | missing)]
    dup = frame.duplicated(subset=["text", "label"], keep="first")
    report.duplicates_found = int(dup.sum())
    if cfg.drop_duplicates:
        report.dropped["duplicate"] = int(dup.sum())
        frame = frame[~dup]
    report.kept = len(frame)
    if report.kept == 0:
        raise ValueError(f"{where}: no usable rows left after cleaning; check text/label columns")
    return frame.reset_index(drop=True), report


def label_names(train_labels: pd.Series, where: str) -> list[str]:
    """Stable label order: numeric order when every label is an integer, else sorted strings."""
    values = sorted(set(train_labels))
    if len(values) < 2:
        raise ValueError(f"{where}: train has a single class {values}; a classifier needs at "
                         "least two label values (check prepare.label_column)")
    try:
        return sorted(values, key=int)
    except ValueError:
        return values


def encode_labels(frame: pd.DataFrame, names: list[str], where: str) -> np.ndarray:
    ids = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(frame["label"]) - set(ids))
    if unknown:
        row = int(frame.loc[frame["label"] == unknown[0], "row"].iloc[0])
        raise ValueError(f"{where}: label {unknown[0]!r} (data row {row + 1}) never occurs in "
                         f"train (train labels: {names}); fix the label or add train examples")
    return frame["label"].map(ids).to_numpy(np.int64)


def carve_validation(train: pd.DataFrame, fraction: float, seed: int,
                     where: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seeded, stratified split of train into (train, validation)."""
    counts = train["label"].value_counts()
    n_val = int(round(len(train) * fraction))
    if counts.min() < 2 or n_val < len(counts):
        raise ValueError(f"{where}: too few rows to carve a stratified validation split "
                         f"(smallest class '{counts.idxmin()}' has {counts.min()} rows, validation "
                         f"would have {n_val}); provide prepare.validation or raise val_fraction")
    kept, held = train_test_split(train, test_size=n_val, random_state=seed,
                                  stratify=train["label"])
    return kept.sort_values("row"), held.sort_values("row")


def label_counts(frame: pd.DataFrame, names: list[str]) -> dict[str, int]:
    counts = frame["label"].value_counts()
    return {name: int(counts.get(name, 0)) for name in names}


def prepare_splits(raw: dict[str, tuple[pd.DataFrame, str]], cfg: PrepareConfig):
    """raw: split -> (frame from sources, where) for train and optionally validation/test.

    Returns (splits: split -> frame with row/text/label-id columns, names, report dict).
    """
    cleaned, reports = {}, {}
    for split, (frame, where) in raw.items():
        cleaned[split], reports[split] = clean(frame, where, cfg)
    train_where = raw["train"][1]
    names = label_names(cleaned["train"]["label"], train_where)
    if "validation" not in cleaned:
        cleaned["train"], cleaned["validation"] = carve_validation(
            cleaned["train"], cfg.val_fraction, cfg.seed, train_where)
        reports["validation"] = SplitReport(rows_read=0, kept=len(cleaned["validation"]))
        reports["train"].kept = len(cleaned["train"])
    out = {}
    for split, frame in cleaned.items():
        where = raw[split][1] if split in raw else f"{train_where} (carved validation)"
        out[split] = pd.DataFrame({"row_id": frame["row"].to_numpy(np.int64),
                                   "text": frame["text"].to_numpy(object),
                                   "label": encode_labels(frame, names, where)})
        reports[split].labels = label_counts(frame, names)
    report = {"num_labels": len(names),
              "validation_carved": int("validation" not in raw),
              "splits": {s: vars(r) for s, r in reports.items()}}
    return out, names, report
