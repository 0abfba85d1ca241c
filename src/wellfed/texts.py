"""The rule a row's text meets wherever it enters: training (prepare), predict and serving.

- **Empty.** A text that is missing (null, NaN) or only whitespace is refused, with its row
  and how many rows share the fault: a model's answer for nothing is not an answer. A file's
  rows are data rows counted from 1, as prepare counts them; a served request's rows are
  counted from 0, as its own list and predict's `row` column count them.
- **Too long.** A text longer than the model's `max_length` tokens (a pair: both texts together)
  is cut to it, longest text first. That is counted and flagged, never silent: tokenize reports
  `truncated_rows`, predict and the served model give each row a `truncated` column.

The served model carries this module (wellfed/use/logged_model.py, CARRIED): numpy and pandas
only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

class InputError(ValueError):
    """Rows or columns a model cannot take: the caller's data, not a fault of the code (the
    served model answers it with HTTP 400)."""


TRUNCATED = "truncated"
"""The output column that flags a row cut to max_length tokens (predict, the served model)."""


def empty(texts: pd.Series, stripped: pd.Series | None = None) -> np.ndarray:
    """Which texts are empty: missing or only whitespace. `stripped`: the texts already stripped
    (prepare strips them anyway, for its duplicate keys)."""
    if stripped is None:
        stripped = texts.map(lambda v: v.strip() if isinstance(v, str) else v)
    return (texts.isna() | (stripped == "")).to_numpy(bool)


def row_name(position: int, first: int = 1) -> str:
    """A row by its position (0 = the first): a file's `data row 1` (1-based, as prepare counts
    them), or with `first` 0 a request's `row 0 (0-based)`, as predict's `row` column and the
    request's own list count them."""
    return f"data row {position + 1}" if first == 1 else f"row {position} (0-based)"


def empty_error(where: str, row: int, count: int, fix: str,
                column: str | None = None, first: int = 1) -> InputError:
    """The one line for empty texts: the first one's data row (1-based; with `first` 0, its
    0-based row), how many, the fix."""
    named = f" in column {column!r}" if column else ""
    return InputError(f"{where}: {row_name(row - first, first)} has empty text{named} ({count} "
                      f"such row{'s' if count != 1 else ''}); {fix}")


def check(columns: dict[str, pd.Series], where: str, fix: str, first: int = 1) -> None:
    """Refuse the rows of `columns` (name -> texts, in row order) with an empty text: the first
    column that has one names the first such row (counted from `first`) and counts them."""
    for name, texts in columns.items():
        mask = empty(texts)
        if mask.any():
            raise empty_error(where, int(np.flatnonzero(mask)[0]) + first, int(mask.sum()), fix,
                              name, first)


def truncation_line(count: int, rows: int, max_length: int, where: str, then: str) -> str:
    """The console's flag for `count` of `rows` rows cut to `max_length` tokens, and what to do
    about it (`then`); "" when none were."""
    if not count:
        return ""
    return (f"{where}: {count} of {rows} rows ({count / max(rows, 1):.1%}) were longer than "
            f"{max_length} tokens and were cut to it; {then}")
