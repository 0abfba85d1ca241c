"""Leaks between splits: rows of a later split whose text an earlier split also holds, counted
per pair of splits and warned about (their scores would be optimistic)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from wellfed.data.hashing import isin
from wellfed.data.scan import Scan
from wellfed.data.wording import SHOWN, plural, row_list

CROSS_SPLITS = (("validation", "train"), ("test", "train"), ("test", "validation"))


def _pairs(scan: Scan, at: np.ndarray) -> np.ndarray:
    """One hash per (text, label) of rows `at`."""
    return pd.util.hash_pandas_object(pd.DataFrame({"key": scan.key[at], "label": scan.label[at]}),
                                      index=False).to_numpy()


def cross_split(outputs: dict, wheres: dict[str, str]) -> tuple[dict[str, int], list[str]]:
    """Rows of a later split whose text is also in an earlier one, per pair, with warnings."""
    counts, warnings = {}, []
    for later, earlier in CROSS_SPLITS:
        if later not in outputs or earlier not in outputs:
            continue
        (mine, mine_mask), (theirs, theirs_mask) = outputs[later], outputs[earlier]
        rows, their_rows = np.flatnonzero(mine_mask), np.flatnonzero(theirs_mask)
        shared = rows[isin(mine.key[rows], theirs.key[their_rows])]
        counts[f"{later}_in_{earlier}"] = len(shared)
        if len(shared):
            differ = int((~isin(_pairs(mine, shared), _pairs(theirs, their_rows))).sum())
            warnings.append(
                f"{wheres[later]}: {plural(len(shared), later + ' row')} "
                f"{'has a text' if len(shared) == 1 else 'have texts'} that {earlier} also holds "
                f"(data row{'s' if len(shared) > 1 else ''} "
                f"{row_list(mine.row[shared[:SHOWN]] + 1, len(shared))}; "
                f"{differ or 'none'} with a different label); {later} scores will be "
                "optimistic: remove them from one of the two files")
    return counts, warnings
