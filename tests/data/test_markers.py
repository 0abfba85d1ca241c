"""Missing-label markers (prepare.missing_labels) on an SNLI-style file shipped in tests/files:
149 labelled train pairs plus SNLI's `-` (2 rows, no annotator consensus) and Hugging Face's
`-1` (1 row, unlabelled); the dev file has 30 labelled pairs and one `-`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import PROJECT, prepare_frames, read_whole
from wellfed.config import PrepareConfig, load_section
from wellfed.data import markers

FILES = Path(__file__).resolve().parents[1] / "files"
SNLI = {"train": "snli_train.tsv", "validation": "snli_dev.tsv", "test": "",
        "text_column": ["sentence1", "sentence2"], "label_column": "gold_label"}
MARKED = ["", "NaN", "null", "None", "-", "-1"]
REAL = ["contradiction", "entailment", "neutral"]


def prepared(**params):
    cfg = PrepareConfig(**{**SNLI, **params})
    raw = {split: (read_whole(FILES / getattr(cfg, split), "auto", cfg.text_column,
                                     cfg.label_column), getattr(cfg, split))
           for split in ("train", "validation")}
    return prepare_frames(raw, cfg)


def marker_warnings(report) -> list[str]:
    return [w for w in report["warnings"] if "prepare.missing_labels" in w]


def test_without_the_param_the_markers_are_classes_and_one_warning_names_it():
    _, names, report = prepared()
    assert names == ["-", "-1"] + REAL
    assert report["splits"]["train"]["labels"] == {"-": 2, "-1": 1, "contradiction": 49,
                                                   "entailment": 49, "neutral": 49}
    (warning,) = marker_warnings(report)
    assert warning == (
        "snli_train.tsv: labels '-' (train 2 rows, 1.3%, validation 1), '-1' (train 1 row, 0.7%, "
        "validation 0) look like \"no label\" markers and are trained as classes; if they mean "
        "\"no label\" (as SNLI's '-' and Hugging Face's -1 do), add them to "
        "prepare.missing_labels (prepare.missing_labels: "
        '["", "NaN", "null", "None", "-", "-1"]) with prepare.on_invalid: skip to drop and '
        "count those rows; if they are real classes, ignore this")


def test_with_the_param_only_the_real_classes_remain_and_the_skipped_rows_are_counted():
    splits, names, report = prepared(missing_labels=MARKED, on_invalid="skip")
    assert names == REAL
    train, dev = report["splits"]["train"], report["splits"]["validation"]
    assert train["rows_read"] == 150 and train["kept"] == 147
    assert train["dropped"]["missing_label"] == 3 and train["missing_labels"] == {"-": 2, "-1": 1}
    assert dev["dropped"]["missing_label"] == 1 and dev["missing_labels"] == {"-": 1}
    assert train["labels"] == dict.fromkeys(REAL, 49)
    assert sorted(splits["train"]["label"].unique()) == [0, 1, 2] and len(splits["train"]) == 147
    assert marker_warnings(report) == []


def test_with_the_param_and_on_invalid_error_the_first_marker_row_is_named():
    with pytest.raises(ValueError) as err:
        prepared(missing_labels=MARKED)
    first = next(i for i, line in enumerate((FILES / "snli_train.tsv").read_text().splitlines())
                 if line.split("\t")[0] in ("-", "-1"))
    label = (FILES / "snli_train.tsv").read_text().splitlines()[first].split("\t")[0]
    assert str(err.value) == (
        f"snli_train.tsv: data row {first} has missing label (written {label!r}; 3 such rows); "
        "add the label, or set prepare.on_invalid: skip to drop and count them")


def test_the_prepare_stage_writes_the_real_classes_and_warns_without_the_param(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("snli_train.tsv", "snli_dev.tsv"):
        (raw / name).write_bytes((FILES / name).read_bytes())

    def stage(params):
        (tmp_path / "params.yaml").write_text(yaml.safe_dump({"prepare": {**SNLI, **params}}))
        proc = subprocess.run([sys.executable, str(PROJECT / "stages" / "prepare.py"), "raw",
                               "prepared", "report.json"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        names = json.loads((tmp_path / "prepared" / "labels.json").read_text())["names"]
        return proc, names, json.loads((tmp_path / "report.json").read_text())

    proc, names, _ = stage({})
    assert names == ["-", "-1"] + REAL
    shown = [line for line in proc.stderr.splitlines() if "prepare.missing_labels" in line]
    assert len(shown) == 1 and shown[0].startswith(
        "[wellfed] warning: raw/snli_train.tsv: labels '-' (train 2 rows")
    proc, names, report = stage({"missing_labels": MARKED, "on_invalid": "skip"})
    assert names == REAL  # labels.json is the model's id2label (tokenize -> train)
    assert report["splits"]["train"]["missing_labels"] == {"-": 2, "-1": 1}
    assert "prepare.missing_labels" not in proc.stderr
    assert "kept 147, dropped 3 (3 missing label)" in proc.stdout


def test_a_marker_only_in_the_test_split_is_an_error_that_names_the_param(tmp_path):
    # GLUE's test splits: every label -1 (hidden). Train never has it.
    test = tmp_path / "test.tsv"
    test.write_text("gold_label\tsentence1\tsentence2\n-1\tA man sleeps.\tA man rests.\n")
    cfg = PrepareConfig(**SNLI)
    files = {"train": FILES / "snli_train.tsv", "validation": FILES / "snli_dev.tsv",
             "test": test}
    raw = {split: (read_whole(path, "auto", cfg.text_column, cfg.label_column), split)
           for split, path in files.items()}
    for split in ("train", "validation"):  # their labelled rows only
        frame = raw[split][0]
        raw[split] = (frame[frame["label"].isin(REAL)], split)
    with pytest.raises(ValueError, match=r"^test: label '-1' \(data row 1\) never occurs in train"
                       r".*; if '-1' means \"no label\", add it to prepare.missing_labels "
                       r'\(prepare.missing_labels: \["", "NaN", "null", "None", "-1"\]\) with '
                       r"prepare.on_invalid: skip to drop and count those rows$"):
        prepare_frames(raw, cfg)


@pytest.mark.parametrize("label, share, suspect", [
    ("-", 0.3, True), ("?", 0.5, True), ("N/A", 0.1, True), ("Unknown", 0.4, True),
    ("none", 0.2, True), ("-1", 0.01, True), ("-1", 0.33, False), ("-3", 0.019, True),
    ("*", 0.01, True), ("!", 0.3, False), ("0", 0.001, False), ("1", 0.01, False),
    ("neutral", 0.001, False), ("ab", 0.001, False), ("·", 0.01, True)])
def test_what_looks_like_a_marker(label, share, suspect):
    assert markers.looks_like_marker(label, share) is suspect


def test_spellings_compare_stripped_in_any_case_and_yaml_null_is_the_word():
    listed = markers.spellings(["", "NaN", None, " N/A ", -1, -2.0])
    assert listed == {"", "nan", "null", "n/a", "-1", "-2"}
    labels = ["n/a", "NULL", None, float("nan"), "-1", "-2", "pos", ("1", "n/a"), ()]
    assert markers.missing(labels, listed).tolist() == [True, True, True, True, True, True,
                                                         False, False, False]
    assert markers.missing([("1", "n/a")], listed, parts=True).tolist() == [True]


def test_a_missing_labels_value_that_is_not_a_list_is_one_line_with_the_fix():
    for bad in ("-", ["-", True], [{"a": 1}]):
        with pytest.raises(ValueError, match=r"prepare.missing_labels must be a list of label "
                                             r"spellings, e.g. \[.*\] \(quote .*\); got"):
            load_section({"prepare": {"missing_labels": bad}}, "prepare")
    assert load_section({"prepare": {"missing_labels": ["-", -1, None]}},
                        "prepare").missing_labels == ["-", -1, None]
