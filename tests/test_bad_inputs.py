"""Every bad raw-data case, through the prepare stage as a user runs it: exit 1, one line naming
the file and the row/line/byte and the fix, and no output left behind (nor a temp file)."""

import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from tests.conftest import PROJECT

GOOD = "sentence\tlabel\n" + "".join(f"good film {i}\t{i % 2}\n" for i in range(20))

CASES = {
    "missing file": ({}, {"validation": "nope.tsv"}, "raw/nope.tsv: raw data file not found"),
    "unknown format": ({"train.txt": "just words\nno delimiters\n"}, {"train": "train.txt"},
                       "cannot tell the format"),
    "parquet named .tsv": ({"train.tsv": b"PAR1\x15\x04\x15\x00\x00\x8a\xff"}, {},
                           "raw/train.tsv: the content is Parquet (starts with the Parquet magic "
                           "bytes PAR1), not TSV as its extension '.tsv' says; rename it to "
                           ".parquet or set prepare.format: parquet"),
    "not utf-8": ({"train.tsv": GOOD.encode() + "caf\xe9\t1\n".encode("latin-1")}, {},
                  "train.tsv: not valid UTF-8 at byte"),
    "missing text column": ({}, {"text_column": "sentense"}, "did you mean 'sentence'"),
    "missing label column": ({}, {"label_column": "lable"}, "did you mean 'label'"),
    "empty text": ({"train.tsv": GOOD + "   \t1\n"}, {}, "data row 21 has empty text"),
    "missing label": ({"train.tsv": GOOD + "text\t\n"}, {}, "data row 21 has missing label"),
    "unseen label in validation": ({"dev.tsv": "sentence\tlabel\nx\t7\n"}, {},
                                   "dev.tsv: label '7' (data row 1) never occurs in train"),
    "single class": ({"train.tsv": "sentence\tlabel\n" + "a\t1\n" * 5}, {},
                     "train has a single class"),
    "too few per class to stratify": ({"train.tsv": GOOD + "odd one\t2\n"}, {"validation": ""},
                                      "raw/train.tsv: cannot carve a stratified validation split: "
                                      "class '2' (1 row: data row 21) needs at least 2 distinct "
                                      "texts (one for each side); add examples, remove those rows, "
                                      "or provide prepare.validation"),
    "ragged row": ({"train.tsv": GOOD + "a\tb\tc\n"}, {}, "line 22 has 3 fields but the header has 2"),
    "unclosed quote": ({"train.csv": 'sentence,label\n"never closed,1\n'}, {"train": "train.csv"},
                       "raw/train.csv: cannot parse as CSV: the quote opened on line 2 is never "
                       "closed (the file ends inside it); close it, or set prepare.quoting: none "
                       "if quotes in this file are plain characters"),
    "empty file": ({"train.tsv": ""}, {}, "train.tsv: the file is empty"),
    "header only": ({"train.tsv": "sentence\tlabel\n"}, {}, "has a header but no data rows"),
    "broken jsonl line": ({"train.jsonl": '{"sentence": "a", "label": 1}\n{"sentence": \n'},
                          {"train": "train.jsonl"}, "train.jsonl: line 2 is not valid JSON"),
    "parquet non-string text": ("parquet-int", {"train": "train.parquet"},
                                "column 'sentence' has type int64, not string"),
    "bad params": ({}, {"val_fraction": 2, "on_invalid": "drop"},
                   "prepare.val_fraction must be in (0, 0.5); got 2"),
}


def write_case(raw, files):
    raw.mkdir()
    (raw / "train.tsv").write_text(GOOD)
    (raw / "dev.tsv").write_text(GOOD)
    if files == "parquet-int":
        pd.DataFrame({"sentence": [1, 2], "label": ["a", "b"]}).to_parquet(raw / "train.parquet")
        return
    for name, content in files.items():
        (raw / name).write_bytes(content if isinstance(content, bytes) else content.encode())


@pytest.mark.integration
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_clear_line_and_leaves_nothing(tmp_path, case):
    files, params, message = CASES[case]
    write_case(tmp_path / "raw", files)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"prepare": {"test": "", **params}}))
    proc = subprocess.run([sys.executable, str(PROJECT / "stages" / "prepare.py"), "raw",
                           "prepared", "reports/prepare.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["params.yaml", "raw"], left  # no outputs, no temporary leftovers


def test_case_table_is_complete():
    assert len(CASES) == 18


def test_skip_mode_counts_instead_of_failing(tmp_path):
    write_case(tmp_path / "raw", {"train.tsv": GOOD + "  \t1\nno label\t\n" + "good film 1\t1\n"})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"prepare": {"test": "", "on_invalid": "skip", "drop_duplicates": True}}))
    proc = subprocess.run([sys.executable, str(PROJECT / "stages" / "prepare.py"), "raw",
                           "prepared", "reports/prepare.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "reports" / "prepare.json").read_text())["splits"]["train"]
    assert report["rows_read"] == 23 and report["kept"] == 20
    assert report["dropped"] == {"empty_text": 1, "missing_label": 1, "duplicate": 1, "conflict": 0}


def test_a_text_longer_than_max_length_is_truncated_and_counted(tokenizer):
    from wellfed.data.tokenization import SplitTokenizer

    encoder = SplitTokenizer(tokenizer, max_length=16, batch_rows=8)
    values, lengths, _ = encoder.encode(["short one", "word " * 100, "exactly " * 14])
    assert lengths.tolist()[1] == 16 and lengths.max() == 16
    assert encoder.truncated == 1  # the 14-word row fits exactly (14 + [CLS] + [SEP])
    assert encoder.stats()["truncated_rows"] == 1


def test_an_unwritable_output_path_is_named(tmp_path):
    write_case(tmp_path / "raw", {})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"prepare": {"test": ""}}))
    (tmp_path / "blocker").write_text("a file where a directory should be")
    proc = subprocess.run([sys.executable, str(PROJECT / "stages" / "prepare.py"), "raw",
                           "blocker/prepared", "reports/prepare.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "blocker: cannot create output directory" in lines[0], lines
