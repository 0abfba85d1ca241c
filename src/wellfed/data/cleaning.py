"""The checks across a split's rows, on the first pass's arrays: empty texts and missing labels
rejected or counted, texts with conflicting labels dropped or rejected (prepare.on_conflict),
duplicates counted and optionally dropped."""

from __future__ import annotations

import numpy as np
import pandas as pd

from wellfed.config import PrepareConfig
from wellfed.data.report import SplitReport
from wellfed.data.scan import Scan, labels_at
from wellfed.data.wording import SHOWN, group_list, occur, plural, short


def _quoted(value) -> str:
    """A label as a message quotes it: repr, cut to 40 characters (a label is the file's
    content: a message names it, it does not carry it whole)."""
    if isinstance(value, str):
        return short(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _repeated(key: np.ndarray) -> np.ndarray:
    """Rows whose text occurs more than once in the split: the only ones that can conflict,
    repeat or stand behind another copy in the carve-out. The one hash table over every row
    (~250 MB at 10M rows); the other checks hash just these."""
    return pd.Series(key).duplicated(keep=False).to_numpy()


def _conflicts(key: np.ndarray, label: np.ndarray,
               repeated: np.ndarray) -> tuple[np.ndarray, int, list[list[int]]]:
    """Rows whose text also occurs with another label, how many such texts there are, and the
    positions of the first rows (up to 4) of the first few such texts, in order of first
    occurrence."""
    mask = np.zeros(len(key), bool)
    rows = np.flatnonzero(repeated)
    if not len(rows):
        return mask, 0, []
    pairs = pd.DataFrame({"key": key[rows], "label": label[rows]})
    per_text = pairs.groupby("key", sort=False)["label"].nunique()
    several = per_text.index[per_text > 1]
    mask[rows[pairs["key"].isin(several).to_numpy()]] = True
    at = np.flatnonzero(mask)
    examples = [at[key[at] == k][:4].tolist() for k in pd.unique(key[at])[:SHOWN]]
    return mask, len(several), examples


def _duplicates(key: np.ndarray, label: np.ndarray, keep: np.ndarray,
                repeated: np.ndarray) -> np.ndarray:
    """Kept rows repeating an earlier kept row's text and label (the first one not counted)."""
    dup = np.zeros(len(key), bool)
    rows = np.flatnonzero(keep & repeated)
    if len(rows):
        again = pd.DataFrame({"key": key[rows], "label": label[rows]}).duplicated()
        dup[rows[again.to_numpy()]] = True
    return dup


def clean(scan: Scan, cfg: PrepareConfig) -> tuple[SplitReport, np.ndarray]:
    """Reject or count what the first pass dropped (empty texts, missing labels); drop (or
    reject) conflicting labels; count and optionally drop duplicates. Returns the report and
    the mask of the rows kept, over the scan's rows."""
    where = scan.where
    if scan.list_row is not None:
        raise ValueError(f"{where}: data row {scan.list_row + 1} has a list of labels, but the "
                         f"task is {scan.task}; set prepare.task: multi_label (or fix the label "
                         "column)")
    report = SplitReport(rows_read=scan.rows_read, nul_texts=scan.nul_texts[0])
    if not scan.rows_read:
        raise ValueError(f"{where}: has a header but no data rows; add rows or fix the path")
    for reason, fix in (("empty_text", "fill in the text"), ("missing_label", "add the label")):
        count, row, label = scan.invalid[reason]
        if count and cfg.on_invalid == "error":
            written = (f"written {_quoted(label)}; " if reason == "missing_label"
                       and isinstance(label, (str, int)) else "")
            raise ValueError(f"{where}: data row {row + 1} has {reason.replace('_', ' ')} "
                             f"({written}{plural(count, 'such row')}); {fix}, or set "
                             f"prepare.on_invalid: skip to drop and count them")
        report.dropped[reason] = count
    report.missing_labels = dict(scan.missing_labels)

    keep = np.ones(len(scan.row), bool)
    scan.repeated = _repeated(scan.key)
    conflict, texts, examples = _conflicts(scan.key, scan.label, scan.repeated)
    report.conflicts = {"texts": texts, "rows": int(conflict.sum()),
                        "first_rows": [[int(scan.row[p]) + 1 for p in group] for group in examples]}
    if texts and cfg.on_conflict == "error":
        labels = iter(labels_at(scan, [p for group in examples for p in group]))
        shown = group_list([[f"{int(scan.row[p]) + 1} {_quoted(next(labels))}" for p in group]
                         for group in examples], texts)
        raise ValueError(f"{where}: {plural(texts, 'text')} {occur(texts)} with different "
                         f"labels in {plural(int(conflict.sum()), 'row')} (data rows {shown}); "
                         "fix those labels, or set prepare.on_conflict: drop to remove such "
                         "rows, or keep to train on them as they are")
    if cfg.on_conflict == "drop":
        report.dropped["conflict"] = int(conflict.sum())
        keep &= ~conflict
    dup = _duplicates(scan.key, scan.label, keep, scan.repeated)
    report.duplicates_found = int(dup.sum())
    if cfg.drop_duplicates:
        report.dropped["duplicate"] = int(dup.sum())
        keep &= ~dup
    report.kept = int(keep.sum())
    if report.kept == 0:
        raise ValueError(f"{where}: no usable rows left after cleaning; check text/label columns")
    return report, keep

