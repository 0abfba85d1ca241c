"""Rows seen across and within splits, through the prepare stage as a user runs it: duplicates
found and dropped, a carved validation that shares no text with train, texts shared between
given splits, conflicting labels, and splits too thin to judge. Files as they come (formats,
quotes, missing labels) and every rejection are tests/test_prepare_inputs.py."""

import pytest

from tests.test_prepare_inputs import (GOOD, ONLY, data_warnings, prepared, report, run_prepare,
                                       stdout_lines, warnings)


# ---------------------------------------------------------------- duplicates, conflicts, leaks

def test_duplicates_found_and_dropped_are_shown_apart(tmp_path):
    dups = "good film 1\t1\ngood film 2\t0\n good film 2 \t0\n"  # the last differs in spaces only
    for drop, dropped in ((False, 0), (True, 3)):
        run_dir = tmp_path / str(drop)
        run_dir.mkdir()
        proc = run_prepare(run_dir, {"train.tsv": GOOD + dups},
                           {**ONLY, "drop_duplicates": drop})
        assert proc.returncode == 0, proc.stderr
        rep = report(run_dir)["splits"]["train"]
        assert rep["duplicates_found"] == 3 and rep["dropped"]["duplicate"] == dropped
        assert f"duplicates: 3 found, {dropped} dropped;" in stdout_lines(proc)[0]


def test_a_carved_validation_never_shares_a_text_with_train(tmp_path):
    # 40 texts, each 3 times: a row-level split would put copies on both sides.
    rows = "".join(f"text {i % 40}\t{i % 40 % 2}\n" for i in range(120))
    proc = run_prepare(tmp_path, {"train.tsv": "sentence\tlabel\n" + rows},
                       {**ONLY, "val_fraction": 0.25})
    assert proc.returncode == 0, proc.stderr
    train, val = prepared(tmp_path, "train"), prepared(tmp_path, "validation")
    assert len(train) == 90 and len(val) == 30  # 10 of 40 texts, with all their copies
    assert set(train["text"]).isdisjoint(val["text"])
    assert report(tmp_path)["cross_split_duplicates"] == {"validation_in_train": 0}
    assert stdout_lines(proc)[1:-1] == [
        "prepare validation: 30 rows carved from train: 0.25 of its distinct texts, stratified "
        "by label, seed 42; labels (2): 0 15, 1 15",
        "prepare: rows whose text is also in another split: validation in train 0"]


def test_texts_shared_between_given_splits_are_counted_and_warned(tmp_path):
    dev = "sentence\tlabel\ngood film 1\t1\ngood film 2\t1\nnew\t0\n"
    test = "sentence\tlabel\ngood film 5\t1\nnew\t0\nother\t1\n"
    proc = run_prepare(tmp_path, {"train.tsv": GOOD, "dev.tsv": dev, "test.tsv": test},
                       {"validation": "dev.tsv", "test": "test.tsv"})
    assert proc.returncode == 0, proc.stderr
    assert report(tmp_path)["cross_split_duplicates"] == {
        "validation_in_train": 2, "test_in_train": 1, "test_in_validation": 1}
    assert stdout_lines(proc)[-2] == ("prepare: rows whose text is also in another split: "
                                      "validation in train 2, test in train 1, test in "
                                      "validation 1")
    assert data_warnings(proc) == [
        "raw/dev.tsv: 2 validation rows have texts that train also holds (data rows 1, 2; 1 with "
        "a different label); validation scores will be optimistic: remove them from one of the "
        "two files",
        "raw/test.tsv: 1 test row has a text that train also holds (data row 1; none with a "
        "different label); test scores will be optimistic: remove them from one of the two files",
        "raw/test.tsv: 1 test row has a text that validation also holds (data row 2; none with a "
        "different label); test scores will be optimistic: remove them from one of the two files"]


@pytest.mark.parametrize("on_conflict, kept, dropped", [("keep", 22, 0), ("drop", 18, 4)])
def test_conflicting_labels_are_counted_with_their_rows(tmp_path, on_conflict, kept, dropped):
    conflicts = "good film 3\t0\ngood film 4\t1\n"  # rows 4 and 5 say 1 and 0
    proc = run_prepare(tmp_path, {"train.tsv": GOOD + conflicts,
                                  "dev.tsv": GOOD.replace("good", "fine")},
                       {"validation": "dev.tsv", "test": "", "on_conflict": on_conflict})
    assert proc.returncode == 0, proc.stderr
    rep = report(tmp_path)["splits"]["train"]
    assert rep["conflicts"] == {"texts": 2, "rows": 4, "first_rows": [[4, 21], [5, 22]]}
    assert rep["kept"] == kept and rep["dropped"]["conflict"] == dropped
    assert (f"conflicting labels: 2 texts in 4 rows, {dropped} dropped;"
            in stdout_lines(proc)[0])
    expected = ["raw/train.tsv: 2 texts occur with different labels (data rows 4/21, 5/22); kept "
                "as they are (prepare.on_conflict: keep); set it to drop or error"]
    assert data_warnings(proc) == (expected if on_conflict == "keep" else [])


def test_a_validation_split_of_one_class_and_a_thin_test_split_are_warned_about(tmp_path):
    """data/coverage.py: a split that cannot rank models is named with its file and the fix."""
    dev = "sentence\tlabel\n" + "".join(f"dev film {i}\t1\n" for i in range(8))
    test = "sentence\tlabel\n" + "".join(f"test film {i}\t{int(i < 2)}\n" for i in range(9))
    proc = run_prepare(tmp_path, {"train.tsv": GOOD, "dev.tsv": dev, "test.tsv": test},
                       {"validation": "dev.tsv", "test": "test.tsv"})
    assert proc.returncode == 0, proc.stderr
    assert warnings(proc) == [
        "validation split (raw/dev.tsv) has one class (1: 8 rows): checkpoint selection on it is "
        "blind and calibration is not applied; give prepare.validation a file with every class, "
        "or set it to \"\" to carve a stratified prepare.val_fraction of train (raise it for more "
        "rows)",
        "test split (raw/test.tsv) has fewer than 5 rows of 1 class (1 2): evaluate's figures on "
        "it are noisy; give prepare.test a file with every class, or set it to \"\" to evaluate "
        "on validation"]
    assert report(tmp_path)["warnings"] == warnings(proc)
