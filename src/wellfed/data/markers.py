"""Missing-label markers: which label spellings mean "this row has no label", and one warning
for labels that look like such a marker but are about to be trained as classes.

Datasets mark an unlabelled row in their own way. SNLI writes gold label `-` for the pairs whose
annotators did not agree (1.6% of its rows); Hugging Face datasets write `-1` (GLUE's test
splits, SNLI's unlabelled pairs); spreadsheets write `N/A`, `?` or `unknown`. Read as labels they
become a class: through params alone SNLI trained a 4-class model whose `-` class (142 train
rows) pulled test macro-F1 down to 0.536. `prepare.missing_labels` lists the spellings that
mean "no label" (compared stripped and in any case); `prepare.on_invalid` then stops at the
first such row or skips and counts them, as for an empty label.
"""

from __future__ import annotations

import json
import re
import string
import unicodedata

import numpy as np

MARKERS = frozenset({
    "-", "--", "?", "??", "n/a", "na", "#n/a", "nan", "null", "none", "nil", "unknown", "unk",
    "missing", "unlabeled", "unlabelled", "no label", "no_label", "nolabel", "undefined"})
"""Labels that read as "no label" whatever their share. A negative integer is not here: -1 is a
real class in -1/0/1 sentiment data, so it is only suspect when rare (`RARE`)."""
RARE = 0.02
"""A class under this share of train rows that is a single punctuation character or a negative
integer is suspect: SNLI's `-` holds 1.6%, Hugging Face's -1 in SNLI train 0.14% (785 of 550k)."""
NEGATIVE = re.compile(r"-\d+")
NO_VALUE = "(no value)"
"""How the report counts a label with no value at all (an empty cell, JSON null, NaN)."""


def spelling(value) -> str:
    """A label or a params entry as compared: stripped, lower case; a whole float as an integer
    (-1.0 is -1, as a Parquet column with a gap stores it)."""
    if isinstance(value, float) and value == value and value.is_integer():
        value = int(value)
    return str(value).strip().lower()


def spellings(entries) -> frozenset[str]:
    """`prepare.missing_labels` as compared. YAML reads an unquoted null as no value at all: it
    stands for the word null."""
    return frozenset("null" if entry is None else spelling(entry) for entry in entries)


def _no_value(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def missing(labels: list, spelled: frozenset[str], parts: bool = False) -> np.ndarray:
    """Which labels mean "no label": no value at all (None, NaN: nothing to train on, whatever
    the list says), or a spelling in `spelled`. A tuple is a multi-label list (never missing:
    an empty list is a row without labels) or, with `parts` (several regression targets), one
    value per target: missing when any of them is."""
    def one(value) -> bool:
        if _no_value(value):
            return True
        if isinstance(value, tuple):
            return parts and any(map(one, value))
        return spelling(value) in spelled

    return np.fromiter(map(one, labels), bool, len(labels))


def tally(counts: dict[str, int], labels: list, codes: np.ndarray, rows: np.ndarray) -> None:
    """Add the rows in mask `rows` to `counts` by their label as written (`labels[code]`; code
    -1 is pandas' factorize code for None and NaN)."""
    found, many = np.unique(codes[rows], return_counts=True)
    for code, n in zip(found.tolist(), many.tolist()):
        value = labels[code] if code >= 0 else None
        key = NO_VALUE if _no_value(value) else str(value)
        counts[key] = counts.get(key, 0) + n


def looks_like_marker(label, share: float) -> bool:
    """Whether a class looks like a "no label" marker: a known one (`MARKERS`), or under `RARE`
    of train rows and a single punctuation character or a negative integer."""
    text = spelling(label)
    if text in MARKERS:
        return True
    if share >= RARE:
        return False
    punctuation = len(text) == 1 and (text in string.punctuation
                                      or unicodedata.category(text).startswith("P"))
    return punctuation or bool(NEGATIVE.fullmatch(text))


def advice(labels: list, listed) -> str:
    """What to set so that `labels` count as missing: the param with the list it needs."""
    wanted = list(listed) + [str(label) for label in labels
                             if spelling(label) not in spellings(listed)]
    shown = json.dumps(["null" if e is None else e for e in wanted], ensure_ascii=False)
    return (f"add {'it' if len(labels) == 1 else 'them'} to prepare.missing_labels "
            f"(prepare.missing_labels: {shown}) with prepare.on_invalid: skip to drop and count "
            "those rows")


def warning(counts: dict[str, dict[str, int]], train_rows: int, where: str, listed) -> list[str]:
    """One warning naming every class that looks like a marker, or []. `counts`: split -> rows
    per class (train first, as the data report has them); `train_rows`: train's kept rows."""
    train = counts["train"]
    suspects = [label for label, n in train.items()
                if looks_like_marker(label, n / max(train_rows, 1))]
    if not suspects:
        return []

    def rows(label) -> str:
        n = train[label]
        others = "".join(f", {split} {split_counts.get(label, 0)}"
                         for split, split_counts in counts.items() if split != "train")
        return f"{label!r} (train {n} row{'s' if n != 1 else ''}, {n / train_rows:.1%}{others})"

    one = len(suspects) == 1
    said = (("label", 'looks like a "no label" marker and is', "a class", "it means",
             "it is a real class") if one else
            ("labels", 'look like "no label" markers and are', "classes", "they mean",
             "they are real classes"))
    return [f"{where}: {said[0]} {', '.join(map(rows, suspects))} {said[1]} trained as "
            f"{said[2]}; if {said[3]} \"no label\" (as SNLI's '-' and Hugging Face's -1 do), "
            f"{advice(suspects, listed)}; if {said[4]}, ignore this"]


def hint(label, listed) -> str:
    """For an error about a label train never has or a regression label that is not a number:
    the way out when the label is a marker, else ''."""
    if not looks_like_marker(label, 0.0):
        return ""
    return f"; if {label!r} means \"no label\", {advice([label], listed)}"
