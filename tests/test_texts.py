"""The one rule for a row's text (wellfed.texts), as prepare, predict and serving apply it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wellfed import texts


def test_missing_or_blank_is_empty_and_anything_else_is_a_text():
    values = pd.Series(["ok", None, float("nan"), "", " \t\n", "  x ", 0, "0"], dtype=object)
    assert texts.empty(values).tolist() == [False, True, True, True, True, False, False, False]
    strings = values.iloc[[0, 1, 3, 4, 5, 7]]  # prepare strips its string column itself
    assert texts.empty(strings, strings.str.strip()).tolist() == texts.empty(strings).tolist()


def test_the_first_empty_row_is_named_from_1_with_the_count():
    with pytest.raises(ValueError) as err:
        texts.check({"a": pd.Series(["x", "y"]), "b": pd.Series(["x", " ", None])}, "input",
                    "fill it in")
    assert str(err.value) == ("input: data row 2 has empty text in column 'b' (2 such rows); "
                              "fill it in")
    texts.check({"a": pd.Series(["x"], dtype=object)}, "input", "-")  # nothing to refuse
    assert str(texts.empty_error("new.csv", 7, 1, "fix it")) == (
        "new.csv: data row 7 has empty text (1 such row); fix it")


def test_truncation_is_said_with_its_share_and_silent_when_none():
    assert texts.truncation_line(0, 10, 128, "predict", "-") == ""
    assert texts.truncation_line(3, 1000, 128, "tokenize train", "raise it") == (
        "tokenize train: 3 of 1000 rows (0.3%) were longer than 128 tokens and were cut to "
        "it; raise it")
    assert isinstance(texts.empty(pd.Series([], dtype=object)), np.ndarray)
