"""Files as they come, through the prepare stage as a user runs it: headerless and extensionless
files, quotes as plain text, long fields, missing-label spellings, rare and many labels. Every
failure is asserted word for word, with exit 1 and nothing left behind; every success with the
rows it read and the lines it printed. Duplicates, conflicts and leaks between splits are
tests/test_prepare_splits.py."""

import json
import re
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from tests.conftest import PROJECT

GOOD = "sentence\tlabel\n" + "".join(f"good film {i}\t{i % 2}\n" for i in range(20))
ONLY = {"validation": "", "test": ""}  # train alone; validation is carved from it

# A headerless, extensionless `label<TAB>text` file whose quotes are plain text: a quote closed
# mid-text (line 8), one never closed (line 21), a field that is quoted whole (line 31), one that
# ends in a quote (line 22), and 2 exact duplicates of line 4.
SMS_LINES = [f"{'spam' if i % 5 == 0 else 'ham'}\tmessage number {i} here" for i in range(200)]
SMS_LINES[7] = 'ham\t"Hello" she said, then left'
SMS_LINES[20] = 'spam\tHe said "wait for me'
SMS_LINES[21] = 'ham\tok"'
SMS_LINES[30] = 'spam\t"quoted whole"'
SMS_LINES += ["ham\tmessage number 3 here"] * 2
SMS = "\n".join(SMS_LINES) + "\n"


def run_prepare(tmp_path, files: dict, params: dict):
    """Write raw/<name> for each file (None = a directory holding one file), run the stage."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for name, content in files.items():
        if content is None:
            (raw / name).mkdir()
            (raw / name / "train.tsv").write_text(GOOD)
        else:
            (raw / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"prepare": params}))
    return subprocess.run([sys.executable, str(PROJECT / "stages" / "prepare.py"), "raw",
                           "prepared", "reports/prepare.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def report(tmp_path) -> dict:
    return json.loads((tmp_path / "reports" / "prepare.json").read_text())


def prepared(tmp_path, split: str) -> pd.DataFrame:
    return pd.read_parquet(tmp_path / "prepared" / f"{split}.parquet")


def stdout_lines(proc) -> list[str]:
    """The stage's own lines, without the time budget it ends with (telemetry/budget.py)."""
    lines = [line.removeprefix("[wellfed] ") for line in proc.stdout.strip().splitlines()]
    assert re.match(r"prepare [\d.]+ s: ", lines[-1]), lines[-1]
    return lines[:-1]


def warnings(proc) -> list[str]:
    lines = proc.stderr.strip().splitlines()
    assert all(line.startswith("[wellfed] warning: ") for line in lines), lines
    return [line.removeprefix("[wellfed] warning: ") for line in lines]


def data_warnings(proc) -> list[str]:
    """The warnings about the rows themselves: not the ones saying that a small validation or
    test split cannot rank models (data/coverage.py; these tests' splits hold a few rows)."""
    return [w for w in warnings(proc) if not w.startswith(("validation split (", "test split ("))]


# ---------------------------------------------------------------- what must be rejected, exactly

FAILURES = {
    "directory given as a file": (
        {"train.tsv": None}, ONLY,
        "raw/train.tsv: is a directory, not a data file (it holds train.tsv); set "
        "prepare.train/validation/test to a file inside it"),
    "jsonl named .csv": (
        {"train.csv": '{"sentence": "a", "label": 1}\n{"sentence": "b", "label": 0, "x": 2}\n'},
        {**ONLY, "train": "train.csv"},
        "raw/train.csv: the content is JSON Lines (line 1 is a JSON object), not CSV as its "
        "extension '.csv' says; rename it to .jsonl or set prepare.format: jsonl"),
    "tsv named .csv": (
        {"train.csv": GOOD}, {**ONLY, "train": "train.csv"},
        "raw/train.csv: the content is TSV (tabs on 21 of the first 21 lines), not CSV as its "
        "extension '.csv' says; rename it to .tsv or set prepare.format: tsv"),
    "json array named .json": (
        {"train.json": '[{"sentence": "a", "label": 1}]\n'}, {**ONLY, "train": "train.json"},
        "raw/train.json: the content is one JSON array (it starts with '[' and an object), not "
        "JSON Lines as its extension '.json' says; write one object per line instead "
        "(jq -c '.[]' train.json > train.jsonl) and name that file"),
    "extensionless file of plain words": (
        {"train": "just words\nno delimiters\n"}, {**ONLY, "train": "train"},
        "raw/train: cannot tell the format: it has no extension, and the content is neither "
        "Parquet, JSON Lines nor tab- or comma-separated (line 1 is 'just words'); set "
        "prepare.format to one of csv, tsv, jsonl, parquet"),
    "json message not cut": (
        {"train.jsonl": '{"sentence": "a", "label": 1}\n{"sentence": "b, \n'},
        {**ONLY, "train": "train.jsonl"},
        "raw/train.jsonl: line 2 is not valid JSON (unterminated string starting at column 14: "
        "'\"b, '); fix or remove that line"),
    "a class with one row cannot be carved": (
        {"train.tsv": GOOD + "odd one\t2\n"}, ONLY,
        "raw/train.tsv: cannot carve a stratified validation split: class '2' (1 row: data row "
        "21) needs at least 2 distinct texts (one for each side); add examples, remove those "
        "rows, or provide prepare.validation"),
    "a class whose rows are one text cannot be carved": (
        {"train.tsv": GOOD + "same\t2\nsame\t2\n"}, ONLY,
        "raw/train.tsv: cannot carve a stratified validation split: class '2' (2 rows, all the "
        "same text: data rows 21, 22) needs at least 2 distinct texts (one for each side); add "
        "examples, remove those rows, or provide prepare.validation"),
    "validation too small for the classes": (
        {"train.tsv": "sentence\tlabel\n" + "".join(f"t{i}\t{i % 5}\n" for i in range(20))}, ONLY,
        "raw/train.tsv: cannot carve a stratified validation split: val_fraction 0.1 of 20 "
        "distinct texts is 2 validation rows, fewer than the 5 classes (each needs one); raise "
        "prepare.val_fraction to 0.25 or provide prepare.validation"),
    "missing column with a close name": (
        {"train.tsv": GOOD}, {**ONLY, "label_column": "lable"},
        "raw/train.tsv: no column 'lable' (prepare.label_column); the file has 'sentence', "
        "'label' (did you mean 'label'?); set prepare.label_column to one of them"),
    "missing column, first line is data": (
        {"train": "pos\tgood\nneg\tbad\n"}, {**ONLY, "train": "train"},
        "raw/train: no column 'sentence' (prepare.text_column); the file has 'pos', 'good'; set "
        "prepare.text_column to one of them or, if line 1 is data rather than column names, set "
        "prepare.header: false and give the columns as 0-based positions"),
    "a name without a header": (
        {"train": "pos\tgood\nneg\tbad\n"}, {**ONLY, "train": "train", "header": False},
        "raw/train: prepare.text_column is 'sentence', but with prepare.header: false the "
        "columns have no names; set it to a 0-based position (line 1: 0 'pos', 1 'good')"),
    "a position past the last column": (
        {"train": "pos\tgood\nneg\tbad\n"},
        {**ONLY, "train": "train", "header": False, "text_column": 2, "label_column": 0},
        "raw/train: prepare.text_column is position 2, but the rows have 2 fields (positions 0 "
        "to 1); set it to one of those"),
    "quote error names the line it opened on": (
        {"train.tsv": GOOD + '"opens here\t1\nmore text\t0\nends" here\t1\n'},
        {**ONLY, "quoting": "csv"},
        "raw/train.tsv: cannot parse as TSV: the quote that opens a field on line 22 closes on "
        "line 24 and is followed by ' here\\t1' instead of a tab or the line end; inside a quoted "
        "field write a quote as two (\"\"), or set prepare.quoting: none if quotes in this file "
        "are plain characters"),
    "quote never closed, auto": (
        {"train.tsv": GOOD + '"never closed\t1\nmore\t0\n'}, ONLY,
        "raw/train.tsv: cannot parse as TSV: the quote opened on line 22 is never closed (the "
        "file ends inside it); close it, or set prepare.quoting: none if quotes in this file "
        "are plain characters"),
    "quotes neither way": (
        {"train.tsv": GOOD + '"a" b\t1\nc\td\te\n'}, ONLY,
        "raw/train.tsv: cannot parse as TSV: the quote that opens a field on line 22 closes on "
        "the same line and is followed by ' b\\t1' instead of a tab or the line end; inside a "
        "quoted field write a quote as two (\"\"); read with quotes as plain characters "
        "(quoting: none) it fails too: line 23 has 3 fields but the header has 2; with "
        "prepare.quoting: none a delimiter inside a text cannot be quoted; remove it from that "
        "row, or quote it and set quoting: csv"),
    "NaN label": (
        {"train.tsv": GOOD + "text x\tNaN\ntext y\tnull\n"}, ONLY,
        "raw/train.tsv: data row 21 has missing label (written 'NaN'; 2 such rows); add the "
        "label, or set prepare.on_invalid: skip to drop and count them"),
    "empty label": (
        {"train.tsv": GOOD + "text x\t\n"}, ONLY,
        "raw/train.tsv: data row 21 has missing label (1 such row); add the label, or set "
        "prepare.on_invalid: skip to drop and count them"),
    "conflicting labels, on_conflict: error": (
        {"train.tsv": GOOD + "good film 3\t0\ngood film 4\t1\n"}, {**ONLY, "on_conflict": "error"},
        "raw/train.tsv: 2 texts occur with different labels in 4 rows (data rows 4 '1'/21 '0', "
        "5 '0'/22 '1'); fix those labels, or set prepare.on_conflict: drop to remove such rows, "
        "or keep to train on them as they are"),
    "many unknown labels are summarised": (
        {"train.tsv": "sentence\tlabel\n" + "".join(f"t{i}\tc{i % 12:02d}\n" for i in range(24)),
         "dev.tsv": "sentence\tlabel\nx\tc99\ny\tc98\n"}, {"validation": "dev.tsv", "test": ""},
        "raw/dev.tsv: label 'c98' (data row 2) and 1 other label never occurs in train (train "
        "labels: 'c00', 'c01', 'c02', 'c03', 'c04', 'c05', 'c06', 'c07', 'c08', 'c09', ... (12 "
        "in all)); fix the label or add train examples"),
    "same column twice": (
        {"train.tsv": GOOD}, {**ONLY, "text_column": 0, "label_column": "sentence"},
        "raw/train.tsv: prepare.text_column (0) and prepare.label_column ('sentence') pick the "
        "same column; point them at different ones"),
    "bad reader params": (
        {"train.tsv": GOOD},
        {**ONLY, "quoting": "sometimes", "header": "no", "on_conflict": "merge", "text_column": -1,
         "label_column": {"a": 1}},
        "params.yaml: prepare.header must be true or false; got 'no'; prepare.on_conflict must "
        "be one of error, keep, drop; got 'merge'; prepare.quoting must be one of auto, none, "
        "csv; got 'sometimes'; prepare.text_column must be a 0-based column position (>= 0); got "
        "-1; prepare.label_column must be a column name or a 0-based column position (or a list of "
        "them); got {'a': 1}"),
    "utf-16": (
        {"train.tsv": GOOD.encode("utf-16")}, ONLY,
        "raw/train.tsv: the file is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8; "
        "re-save it as UTF-8 (e.g. iconv -f utf-16 -t utf-8)"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_bad_input_is_one_exact_line_exit_1_and_leaves_nothing(tmp_path, case):
    files, params, message = FAILURES[case]
    proc = run_prepare(tmp_path, files, params)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {message}"]
    assert proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "raw"]


def test_failure_table_is_complete():
    assert len(FAILURES) == 23


# ---------------------------------------------------------------- files that must go through

@pytest.mark.parametrize("quoting, how", [
    ("none", "quotes as plain characters (quoting: none)"),
    ("auto", "quotes as plain characters (quoting: auto; RFC 4180 quoting fails on line 8)"),
])
def test_headerless_extensionless_tsv_with_plain_quotes_reads_every_row(tmp_path, quoting, how):
    proc = run_prepare(tmp_path, {"SMSSpamCollection": SMS},
                       {**ONLY, "train": "SMSSpamCollection", "header": False, "quoting": quoting,
                        "text_column": 1, "label_column": 0})
    assert proc.returncode == 0, proc.stderr
    rep = report(tmp_path)["splits"]
    assert rep["train"]["rows_read"] == 202
    assert rep["train"]["kept"] + rep["validation"]["kept"] == 202  # every row, none dropped
    texts = pd.concat([prepared(tmp_path, "train"), prepared(tmp_path, "validation")])
    texts = texts.set_index("row_id")["text"]
    assert texts[7] == '"Hello" she said, then left' and texts[20] == 'He said "wait for me'
    assert texts[21] == 'ok"' and texts[30] == '"quoted whole"'  # quotes kept as written
    assert stdout_lines(proc)[0] == (
        "prepare train: 202 rows read as TSV from its content (tabs on 50 of the first 50 "
        f"lines), no header line, {how}; kept 182, dropped 0; duplicates: 2 found, 0 dropped; "
        "labels (2): ham 146, spam 36")
    assert data_warnings(proc) == []


def test_a_field_longer_than_the_csv_default_limit_goes_through(tmp_path):
    long_text = "word " * 40_000  # 200,000 characters; Python csv stops at 131,072 by default
    rows = "".join(f'"{long_text}{i}",{i % 2}\n' for i in range(20))
    proc = run_prepare(tmp_path, {"train.csv": "sentence,label\n" + rows},
                       {**ONLY, "train": "train.csv"})
    assert proc.returncode == 0, proc.stderr
    texts = pd.concat([prepared(tmp_path, "train"), prepared(tmp_path, "validation")])["text"]
    assert len(texts) == 20 and texts.str.len().min() == 200_001


def test_columns_by_position_with_a_header(tmp_path):
    proc = run_prepare(tmp_path, {"train.tsv": GOOD},
                       {**ONLY, "text_column": 0, "label_column": 1})
    assert proc.returncode == 0, proc.stderr
    assert report(tmp_path)["splits"]["train"]["rows_read"] == 20


def test_missing_label_spellings_are_skipped_and_counted(tmp_path):
    spellings = ["NaN", "nan", "null", "NULL", "None", "none", " ", ""]
    extra = "".join(f"no label {i}\t{s}\n" for i, s in enumerate(spellings))
    proc = run_prepare(tmp_path, {"train.tsv": GOOD + extra}, {**ONLY, "on_invalid": "skip"})
    assert proc.returncode == 0, proc.stderr
    rep = report(tmp_path)
    assert rep["num_labels"] == 2  # no 'NaN' class
    assert rep["splits"]["train"]["dropped"]["missing_label"] == len(spellings) == 8
    assert stdout_lines(proc)[0].startswith("prepare train: 28 rows read as TSV (from the "
                                            "extension .tsv), with a header line, no quotes in "
                                            "the file; kept 18, dropped 8 (8 missing label);")


def test_a_class_with_a_single_train_row_is_warned_about(tmp_path):
    dev = "sentence\tlabel\n" + "".join(f"dev film {i}\t{i % 2}\n" for i in range(6))
    proc = run_prepare(tmp_path, {"train.tsv": GOOD + "odd one\trare\n", "dev.tsv": dev},
                       {"validation": "dev.tsv", "test": ""})
    assert proc.returncode == 0, proc.stderr
    assert data_warnings(proc) == [
        "raw/train.tsv: 1 class with a single train row: 'rare' (data row 21); a model can "
        "hardly learn a class from one example and its scores mean little: check the label's "
        "spelling, add examples, or remove the row"]
    assert report(tmp_path)["warnings"] == warnings(proc)


def test_many_labels_are_summarised_on_the_console(tmp_path):
    train = "".join(f"text {i}\tintent_{i % 77:02d}\n" for i in range(77 * 3 + 5))
    dev = "".join(f"dev {i}\tintent_{i % 77:02d}\n" for i in range(77))
    proc = run_prepare(tmp_path, {"train.tsv": "sentence\tlabel\n" + train,
                                  "dev.tsv": "sentence\tlabel\n" + dev},
                       {"validation": "dev.tsv", "test": ""})
    assert proc.returncode == 0, proc.stderr
    lines = stdout_lines(proc)
    assert len(lines) == 4  # train, validation, cross-split, task
    assert lines[-1] == ("prepare: task single_label (77 distinct labels, one per row); set "
                         "prepare.task to choose another")
    assert lines[0].endswith(
        "labels (77): 3 to 4 rows each (most: intent_00 4, intent_01 4, intent_02 4; fewest: "
        "intent_74 3, intent_75 3, intent_76 3); every count is in reports/prepare.json")
    assert lines[1].endswith("labels (77): 1 row each (most: intent_00 1, intent_01 1, intent_02 "
                             "1; fewest: intent_74 1, intent_75 1, intent_76 1); every count is "
                             "in reports/prepare.json")
    assert len(report(tmp_path)["splits"]["train"]["labels"]) == 77


def test_a_nul_byte_in_a_text_is_kept_counted_and_warned_about(tmp_path):
    """A NUL byte inside a text is kept as written, as every text is (no rule rewrites one),
    and never silently: counted per split in the report, on the console, and warned about
    with the first row."""
    train = GOOD + "the soundt\x00rack\t1\nok\t0\n\x00both\x00\t0\n"
    pairs = "premise\thypothesis\tlabel\n" + "".join(f"a {i}\tb {i}\t{i % 2}\n"
                                                  for i in range(20))
    proc = run_prepare(tmp_path, {"train.tsv": train}, ONLY)
    assert proc.returncode == 0, proc.stderr
    rep = report(tmp_path)["splits"]
    assert rep["validation"]["nul_texts"] == 0  # carved from train: counted there
    assert rep["train"]["rows_read"] == 23 and rep["train"]["nul_texts"] == 2
    texts = pd.concat([prepared(tmp_path, "train"), prepared(tmp_path, "validation")])["text"]
    assert "the soundt\x00rack" in texts.tolist()  # kept as written
    assert "; 2 texts hold a NUL byte (kept); " in stdout_lines(proc)[0]
    assert data_warnings(proc) == [
        "raw/train.tsv: 2 texts hold a NUL byte (the first: data row 21); kept as written (a "
        "BERT tokenizer drops the character, a byte-level one reads it as a token); if it is "
        "damage, remove it from the file (e.g. tr -d '\\000' < train.tsv > fixed.tsv)"]
    # a sentence pair: the second text counts too, once per row
    (tmp_path / "pair").mkdir()
    proc = run_prepare(tmp_path / "pair",
                       {"train.tsv": pairs.replace("b 3", "b\x003").replace("a 3", "a\x003")},
                       {**ONLY, "text_column": ["premise", "hypothesis"]})
    assert proc.returncode == 0, proc.stderr
    assert report(tmp_path / "pair")["splits"]["train"]["nul_texts"] == 1
