"""Texts and labels as 64-bit hashes, and membership tests on them: preparation compares rows
by these numbers (8 bytes a row), not by their strings. Two different texts share a hash with
probability ~n^2 / 2^65 (~3e-6 at 10M rows)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def hashes(values) -> np.ndarray:
    """64-bit hashes of strings (or tuples of them), consistent within one process."""
    return np.fromiter(map(hash, values), np.int64, count=len(values))


def empty_int64() -> np.ndarray:
    """Where the per-row arrays (hashes, data rows, label codes) start."""
    return np.zeros(0, np.int64)


def isin(values: np.ndarray, among: np.ndarray) -> np.ndarray:
    """np.isin with a hash table of the smaller side (pandas) instead of sorting both: less
    memory when one side has 10M rows."""
    if len(among) > len(values):
        among = among[pd.Series(among).isin(values).to_numpy()]
    return pd.Series(values).isin(among).to_numpy()
