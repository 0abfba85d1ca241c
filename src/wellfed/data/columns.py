"""Which columns of a raw file are the text and the label, and the rows as every reader returns
them: (row, text[, text_pair], label), labels as stripped strings."""

from __future__ import annotations

import difflib

import numpy as np
import pandas as pd

from wellfed.data.wording import short


def column_at(frame: pd.DataFrame, where: str, column: str | int, key: str, named: bool) -> int:
    """The position of the frame's column that `column` (a name, or a 0-based position) picks."""
    columns = list(frame.columns)
    shown = [str(c) for c in columns]
    if isinstance(column, str) and named and column in shown:
        if shown.count(column) > 1:
            at = [i for i, c in enumerate(shown) if c == column]
            raise ValueError(f"{where}: the header names {column!r} {len(at)} times (positions "
                             f"{', '.join(map(str, at))}); rename one, or set prepare.{key} to "
                             "the 0-based position of the one you mean")
        return shown.index(column)
    digits = isinstance(column, str) and column.isascii() and column.isdigit()
    index = column if isinstance(column, int) else int(column) if digits else None
    if index is not None:
        if index < len(columns):
            return index
        raise ValueError(f"{where}: prepare.{key} is position {index}, but the rows have "
                         f"{len(columns)} fields (positions 0 to {len(columns) - 1}); set it "
                         "to one of those")
    if not named:
        fields = ", ".join(f"{i} {short(str(v), 20)}" for i, v in
                           enumerate(frame.iloc[0].tolist() if len(frame) else []))
        raise ValueError(f"{where}: prepare.{key} is {column!r}, but with prepare.header: false "
                         f"the columns have no names; set it to a 0-based position (line 1: "
                         f"{fields})")
    close = difflib.get_close_matches(column, shown, n=2, cutoff=0.4)
    names = ", ".join(short(c) for c in shown[:20]) + (", ..." if len(shown) > 20 else "")
    if close:
        fix = (f" (did you mean {' or '.join(repr(c) for c in close)}?); set prepare.{key} to "
               "one of them")
    else:
        fix = (f"; set prepare.{key} to one of them or, if line 1 is data rather than column "
               "names, set prepare.header: false and give the columns as 0-based positions")
    raise ValueError(f"{where}: no column '{column}' (prepare.{key}); the file has {names}{fix}")


def listed(columns) -> list:
    return list(columns) if isinstance(columns, (list, tuple)) else [columns]


def label_text(value) -> str | tuple | None:
    """A label as a stripped string; None for a missing one. A float label that is a whole
    number (1.0: an integer column with a gap, as pandas and Parquet store it) is written 1.
    A list (multi-label in JSONL/Parquet) is a tuple of such strings, missing ones left out."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(t for t in map(label_text, value) if t is not None)
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float):
        if value != value:
            return None
        if value.is_integer():
            value = int(value)
    return str(value).strip() or None


def select_columns(frame: pd.DataFrame, where: str, text_column, label_column,
                   named: bool = True, first_row: int = 0) -> pd.DataFrame:
    """(row, text[, text_pair], label): one text column or a pair; one label column, or
    several (regression targets) whose texts make a tuple per row. `row` starts at `first_row`
    (a block's place in its file)."""
    text_at = [column_at(frame, where, c, "text_column", named) for c in listed(text_column)]
    label_at = [column_at(frame, where, c, "label_column", named) for c in listed(label_column)]
    both = set(text_at) & set(label_at)
    if both or len(set(text_at)) < len(text_at):
        raise ValueError(f"{where}: prepare.text_column ({text_column!r}) and prepare.label_column "
                         f"({label_column!r}) pick the same column; point them at "
                         "different ones")
    # Missing labels stay None (or their spelling, e.g. 'NaN') so that `prepare` can count or
    # reject them by row.
    if len(label_at) == 1:
        labels = frame.iloc[:, label_at[0]].map(label_text).values
    else:
        parts = [frame.iloc[:, at].map(label_text) for at in label_at]
        labels = [None if None in row else row for row in zip(*parts)]
    out = {"row": range(first_row, first_row + len(frame))}
    for name, at in zip(("text", "text_pair"), text_at):
        out[name] = frame.iloc[:, at].map(lambda v: v if isinstance(v, str) else None).values
    out["label"] = labels
    return pd.DataFrame(out)



def position(column) -> int | None:
    """A column given as a 0-based position (an int or a digit string), else None."""
    if isinstance(column, int):
        return column
    return int(column) if column.isascii() and column.isdigit() else None


def has_column(names: list, column) -> bool:
    """Whether `column_at` finds `column` among named columns `names`."""
    if isinstance(column, str) and column in [str(n) for n in names]:
        return True
    at = position(column)
    return at is not None and at < len(names)
