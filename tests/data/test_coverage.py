"""Whether a validation or test split can judge a model (data/coverage.py), on its properties:
one class (or one label, or a constant target) cannot; fewer than MIN_ROWS of a class can only
shakily; every count comes from the split's labels as the token file holds them."""

from __future__ import annotations

import numpy as np
import pytest

from wellfed.data import coverage


def test_one_class_cannot_judge_and_says_which_class_it_has():
    counts = coverage.counts("single_label", np.ones(150, np.int64), ["negative", "positive"])
    assert counts == {"negative": 0, "positive": 150}
    gap = coverage.gap("validation", "single_label", counts)
    assert gap.one_class and gap.problem == "has one class (positive: 150 rows)"
    line = gap.warning("data/tokens/validation.arrow")
    assert line.startswith("validation split (data/tokens/validation.arrow) has one class "
                           "(positive: 150 rows): checkpoint selection on it is blind and "
                           "calibration is not applied; give prepare.validation a file")


@pytest.mark.parametrize("labels, problem", [
    ([0] * 20 + [1] * 4 + [2] * 20, "has fewer than 5 rows of 1 class (b 4)"),
    ([0] * 20 + [2] * 20, "has fewer than 5 rows of 1 class (b 0)"),  # a class it lacks
    ([0] * 5 + [1] * 5 + [2] * 5, None),
])
def test_a_class_with_few_rows_or_none_is_named_with_its_count(labels, problem):
    counts = coverage.counts("single_label", np.array(labels), ["a", "b", "c"])
    gap = coverage.gap("test", "single_label", counts)
    assert (gap.problem if gap else None) == problem
    if gap:
        assert not gap.one_class and "evaluate's figures on it are noisy" in gap.warning("t.tsv")


def test_multi_label_counts_the_rows_holding_each_label():
    rows = np.zeros((30, 3), np.float32)
    rows[:, 0] = 1  # every row holds `a`, none holds the others
    counts = coverage.counts("multi_label", rows, ["a", "b", "c"])
    assert counts == {"a": 30, "b": 0, "c": 0}
    assert coverage.gap("validation", "multi_label", counts).problem == "has one label (a: 30 rows)"
    rows[:10, 1] = rows[10:20, 2] = 1
    assert coverage.gap("validation", "multi_label",
                        coverage.counts("multi_label", rows, ["a", "b", "c"])) is None


def test_regression_needs_a_target_that_varies():
    flat = coverage.counts("regression", np.full(20, 3.0, np.float32), ["score"])
    assert coverage.gap("validation", "regression", flat).problem == (
        "has a constant target (score): Pearson's r is undefined on it")
    varied = coverage.counts("regression", np.arange(20, dtype=np.float32), ["score"])
    assert coverage.gap("validation", "regression", varied) is None


def test_an_empty_split_has_no_class():
    counts = coverage.counts("single_label", np.array([], np.int64), ["a", "b"])
    assert coverage.gap("validation", "single_label", counts).problem == "has no class (none)"
