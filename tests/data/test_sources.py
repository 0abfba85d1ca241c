import json

import pandas as pd
import pytest

from tests.conftest import read_whole, write_tsv


def test_tsv_with_quoted_tabs_newlines_and_bom(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_bytes("\ufeffsentence\tlabel\n\"a\ttab\"\t1\n\"two\nlines\"\t0\n\"say \"\"hi\"\"\"\t1\nNA\t0\n"
                     .encode("utf-8"))
    frame = read_whole(path, "auto", "sentence", "label")
    assert frame["text"].tolist() == ["a\ttab", "two\nlines", 'say "hi"', "NA"]
    assert frame["label"].tolist() == ["1", "0", "1", "0"]
    assert frame["row"].tolist() == [0, 1, 2, 3]


def test_csv_jsonl_parquet_read_the_same_rows(tmp_path):
    rows = [("good film", "pos"), ("bad, really", "neg")]
    frame = pd.DataFrame(rows, columns=["text", "y"])
    frame.to_csv(tmp_path / "a.csv", index=False)
    frame.to_parquet(tmp_path / "a.parquet")
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": t, "y": y}) for t, y in rows))
    read = [read_whole(tmp_path / f"a.{ext}", "auto", "text", "y") for ext in ("csv", "jsonl", "parquet")]
    assert len(read) == 3
    for got in read:
        assert list(zip(got["text"], got["label"])) == rows


@pytest.mark.parametrize("content, message", [
    (b"sentence\tlabel\ngood\t1\nbad\xff\t0\n", r"not valid UTF-8 at byte 25 \(line 3\)"),
    (b"", "the file is empty"),
    (b"sentence\tlabel\ngood\t1\tEXTRA\tMORE\n", "line 2 has 4 fields but the header has 2"),
])
def test_unreadable_files_name_the_file_and_the_place(tmp_path, content, message):
    path = tmp_path / "bad.tsv"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        read_whole(path, "auto", "sentence", "label")
    assert str(path) in str(err.value)


def test_missing_column_suggests_the_closest(tmp_path):
    path = write_tsv(tmp_path / "t.tsv", [("x", "1")], header=("sentence", "labels"))
    with pytest.raises(ValueError, match=r"no column 'label' \(prepare.label_column\).*did you mean 'labels'"):
        read_whole(path, "auto", "sentence", "label")


def test_broken_jsonl_line_and_unknown_extension(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": 1}\n{"text": "b", "label": \n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_whole(path, "auto", "text", "label")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(ValueError, match="set prepare.format"):
        read_whole(tmp_path / "d.txt", "auto", "text", "label")
    with pytest.raises(FileNotFoundError, match="raw data file not found"):
        read_whole(tmp_path / "missing.tsv", "auto", "text", "label")


def test_parquet_text_column_must_be_strings(tmp_path):
    pd.DataFrame({"text": [1, 2], "label": ["a", "b"]}).to_parquet(tmp_path / "n.parquet")
    with pytest.raises(ValueError, match="has type int64, not string"):
        read_whole(tmp_path / "n.parquet", "auto", "text", "label")


def test_auto_quoting_warns_when_plain_quotes_would_read_more_rows(tmp_path):
    path = tmp_path / "labelled"  # extensionless: sniffed as TSV
    path.write_text('ham\tone\nham\t"Hello there\nspam\tsee you"\nham\tfour\n')
    frame = read_whole(path, "auto", 1, 0, header=False)
    assert frame["text"].tolist() == ["one", "Hello there\nspam\tsee you", "four"]
    assert frame.attrs["warnings"] == [
        f"{path}: 1 quoted field span several lines (the first starts on line 2), giving 3 rows; "
        "read with quotes as plain characters every line is a row of its own (4 rows). If "
        "quotes in this file are plain characters, set prepare.quoting: none"]
    plain = read_whole(path, "auto", 1, 0, header=False, quoting="none")
    assert plain["text"].tolist() == ["one", '"Hello there', 'see you"', "four"]


def test_auto_quoting_keeps_real_multiline_fields(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text('text,label\n"Great.\nLoved it, really",5\n"ok, fine",3\n')
    frame = read_whole(path, "auto", "text", "label")
    assert frame["text"].tolist() == ["Great.\nLoved it, really", "ok, fine"]
    assert frame.attrs["read_as"].endswith("quotes as in RFC 4180 (quoting: auto)")
    assert frame.attrs["warnings"] == []


def test_jsonl_text_may_hold_unicode_line_separators(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"text": "one\u2028two\x85three", "label": 1.0}, {"text": "b", "label": float("nan")}]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8")
    frame = read_whole(path, "auto", "text", "label")
    assert frame["text"].tolist() == ["one\u2028two\x85three", "b"]
    assert frame["label"][0] == "1" and pd.isna(frame["label"][1])  # 1.0 is 1; NaN is missing


def test_a_headerless_tsv_whose_text_starts_with_a_bracket_is_not_json(tmp_path):
    path = tmp_path / "train"  # GoEmotions: text, labels, id; texts often start with [NAME]
    path.write_text("[NAME] is great\t27\teebbqej\n{not json} either\t2\ted00q6i\n")
    frame = read_whole(path, "auto", 0, 1, header=False)
    assert frame["text"].tolist() == ["[NAME] is great", "{not json} either"]


def test_compressed_files_are_named(tmp_path):
    import gzip

    path = tmp_path / "train.tsv"
    path.write_bytes(gzip.compress(b"sentence\tlabel\na\t1\n"))
    with pytest.raises(ValueError) as err:
        read_whole(path, "auto", "sentence", "label")
    assert str(err.value) == (f"{path}: the content is gzip-compressed (starts with the gzip "
                              "magic bytes), not TSV as its extension '.tsv' says; decompress it "
                              "first (gunzip -k train.tsv) and name the result")
