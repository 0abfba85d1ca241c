import pandas as pd
import pytest

from tests.conftest import prepare_frames
from wellfed.config import PrepareConfig


def frame(rows):
    return pd.DataFrame({"row": range(len(rows)), "text": [r[0] for r in rows],
                         "label": [r[1] for r in rows]})


TRAIN = [(f"text {i}", str(i % 2)) for i in range(40)]


def test_labels_map_in_numeric_order_and_validation_is_carved_stratified():
    raw = {"train": (frame([(f"t{i}", str(10 if i % 4 else 9)) for i in range(80)]), "train.tsv")}
    splits, names, report = prepare_frames(raw, PrepareConfig(val_fraction=0.25, seed=1))
    assert names == ["9", "10"]  # numeric, not string, order
    assert len(splits["train"]) == 60 and len(splits["validation"]) == 20
    assert splits["validation"]["label"].value_counts().to_dict() == {1: 15, 0: 5}
    assert set(splits["train"]["row_id"]).isdisjoint(splits["validation"]["row_id"])
    assert report["validation_carved"] == 1


def test_invalid_rows_error_by_default_and_are_counted_when_skipped():
    rows = TRAIN + [("  ", "1"), ("no label", None)]
    with pytest.raises(ValueError, match=r"train.tsv: data row 41 has empty text.*on_invalid: skip"):
        prepare_frames({"train": (frame(rows), "train.tsv"),
                        "validation": (frame(TRAIN[:4]), "dev.tsv")}, PrepareConfig())
    splits, _, report = prepare_frames({"train": (frame(rows), "train.tsv"),
                                        "validation": (frame(TRAIN[:4]), "dev.tsv")},
                                       PrepareConfig(on_invalid="skip"))
    rep = report["splits"]["train"]
    assert rep["rows_read"] == 42 and rep["kept"] == 40
    assert rep["dropped"] == {"empty_text": 1, "missing_label": 1, "duplicate": 0, "conflict": 0}


def test_duplicates_are_counted_and_dropped_only_on_request():
    rows = TRAIN + TRAIN[:3]
    raw = {"train": (frame(rows), "t"), "validation": (frame(TRAIN[:4]), "v")}
    _, _, kept = prepare_frames(raw, PrepareConfig())
    _, _, dropped = prepare_frames(raw, PrepareConfig(drop_duplicates=True))
    assert kept["splits"]["train"]["duplicates_found"] == 3 and kept["splits"]["train"]["kept"] == 43
    assert dropped["splits"]["train"]["dropped"]["duplicate"] == 3
    assert dropped["splits"]["train"]["kept"] == 40


@pytest.mark.parametrize("raw, message", [
    ({"train": (frame([("a", "x"), ("b", "x")]), "t.tsv")}, "train has a single class"),
    ({"train": (frame(TRAIN), "t.tsv"), "validation": (frame([("c", "7")]), "dev.tsv")},
     r"dev.tsv: label '7' \(data row 1\) never occurs in train"),
    ({"train": (frame(TRAIN[:4] + [("z", "2")]), "t.tsv")},
     r"cannot carve a stratified validation split: class '2' \(1 row: data row 5\) needs at least 2"),
])
def test_label_problems_are_clear(raw, message):
    with pytest.raises(ValueError, match=message):
        prepare_frames(raw, PrepareConfig())
