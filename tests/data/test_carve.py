"""The validation carve on its properties: stratified (each class within a row of its share),
seeded, exactly the rows asked for, a train row left in every class that has two, and every
copy of a text on one side."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import prepare_frames
from wellfed.config import PrepareConfig
from wellfed.data.carve import held_per_class, stratified_held

SETTINGS = settings(max_examples=200, deadline=None)


def shuffled_classes(counts: list[int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(len(counts)), counts))


@pytest.mark.integration
@SETTINGS
@given(counts=st.lists(st.integers(2, 300), min_size=1, max_size=12),
       fraction=st.floats(0.01, 0.49), seed=st.integers(0, 2**32 - 1))
def test_the_carve_is_stratified_exact_and_leaves_every_class_a_train_row(counts, fraction, seed):
    classes = shuffled_classes(counts, seed)
    n_held = int(round(len(classes) * fraction))
    held = stratified_held(classes, n_held, seed)
    assert len(held) == n_held == len(np.unique(held))
    assert held.min(initial=0) >= 0 and held.max(initial=0) < len(classes)
    per_class = np.bincount(classes[held], minlength=len(counts))
    share = n_held * np.array(counts) / len(classes)
    assert (np.abs(per_class - share) < 1).all(), (per_class, share)
    assert (per_class < np.array(counts)).all()  # every class keeps a train row


@SETTINGS
@given(counts=st.lists(st.integers(1, 6), min_size=1, max_size=8), data=st.data())
def test_any_share_holds_exactly_n_and_keeps_train_rows_where_it_can(counts, data):
    counts = np.array(counts)
    n_held = data.draw(st.integers(0, int(counts.sum())))
    held = held_per_class(counts, n_held, np.random.default_rng(data.draw(st.integers(0, 99))))
    assert held.sum() == n_held and (held >= 0).all() and (held <= counts).all()
    keeps_one = np.where(counts >= 2, counts - 1, counts)
    if n_held <= keeps_one.sum():
        assert (held <= keeps_one).all()


def test_the_same_seed_draws_the_same_rows_and_another_seed_others():
    classes = shuffled_classes([500, 300, 150, 50], seed=3)
    draws = [stratified_held(classes, 100, seed) for seed in (0, 1, 2, 3, 4)]
    np.testing.assert_array_equal(draws[0], stratified_held(classes, 100, 0))
    assert len({tuple(d) for d in draws}) == 5
    # the remainders' ties go to a seeded draw too: 4 equal classes, 2 rows to hold
    chosen = {tuple(held_per_class(np.full(4, 5), 2, np.random.default_rng(s)))
              for s in range(20)}
    assert len(chosen) > 1 and all(sum(c) == 2 and max(c) == 1 for c in chosen)


def test_a_class_too_small_for_its_share_keeps_its_train_row():
    counts = np.array([2, 2, 2, 2, 100])  # 0.6 of 108 = 65 rows: 1.2 of each 2-row class
    held = held_per_class(counts, 65, np.random.default_rng(0))
    assert held.tolist()[:4] == [1, 1, 1, 1] and held.sum() == 65


def test_holding_more_rows_than_there_are_is_an_error():
    with pytest.raises(ValueError, match="cannot hold out 5 of 4 rows"):
        stratified_held(np.array([0, 0, 1, 1]), 5, 0)


@pytest.mark.parametrize("seed", [0, 1, 42])
def test_the_carve_of_prepare_keeps_every_copy_of_a_text_on_one_side(seed):
    # 300 texts of 3 classes (50, 100, 150), about 100 of them repeated once or more
    rng = np.random.default_rng(seed)
    texts = [(f"text {i}", "abbccc"[i % 6]) for i in range(300)]
    rows = texts + [texts[i] for i in rng.choice(300, 300) if i % 3 == 0]
    assert len(rows) > 360
    rows = [rows[i] for i in rng.permutation(len(rows))]
    frame = pd.DataFrame({"row": range(len(rows)), "text": [r[0] for r in rows],
                          "label": [r[1] for r in rows]})
    splits, names, report = prepare_frames({"train": (frame, "train.tsv")},
                                           PrepareConfig(val_fraction=0.2, seed=seed))
    train, val = splits["train"], splits["validation"]
    assert len(train) + len(val) == len(rows)
    assert set(train["text"]).isdisjoint(val["text"])  # every copy on one side
    held = val.drop_duplicates("text")["label"].map(dict(enumerate(names))).value_counts()
    assert held.sum() == 60  # 0.2 of 300 distinct texts
    assert held.to_dict() == {"c": 30, "b": 20, "a": 10}  # 0.2 of each class's texts
    assert report["splits"]["validation"]["read_as"] == (
        f"carved from train: 0.2 of its distinct texts, stratified by label, seed {seed}")
