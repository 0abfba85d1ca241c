"""Raw files read in many small blocks give what reading them whole gives: the same rows and row
numbers, the same errors naming the same lines, the same prepared splits and report."""

import csv
import functools
import io
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import prepare_frames, read_whole
from wellfed.config import PrepareConfig
from wellfed.data import prepare, sources

SMALL = 64  # bytes per block: a few-KB file comes in dozens of blocks


def write_csv(path, rows, header=("text", "label"), sep=","):
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, delimiter=sep, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def in_blocks(path, block_bytes=SMALL, **kw) -> list[pd.DataFrame]:
    return list(sources.iter_file(path, "auto", "text", "label", block_bytes=block_bytes, **kw))


def whole(blocks: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(blocks, ignore_index=True)


def plain(frame: pd.DataFrame) -> dict:
    """Columns as lists, a missing value as None (a block's column may be object where the
    whole file's is pandas' string dtype)."""
    return {c: [None if v is None or v != v else v for v in frame[c]] for c in frame}


def test_quoted_fields_with_newlines_across_block_edges_read_as_whole(tmp_path):
    long = "a field of its own, " + "\n".join(f"line {k} with \"quotes\"" for k in range(12))
    rows = [(long + str(i) if i % 7 == 0 else f"plain, {i}", str(i % 3)) for i in range(120)]
    path = write_csv(tmp_path / "t.csv", rows)
    assert len(long) > 3 * SMALL  # each such record spans several blocks' worth of bytes
    blocks = in_blocks(path)
    assert len(blocks) > 30
    got = whole(blocks)
    assert list(zip(got["text"], got["label"])) == rows
    assert got["row"].tolist() == list(range(120))
    expected = read_whole(path, "auto", "text", "label")
    pd.testing.assert_frame_equal(got, expected)
    assert {b.attrs["read_as"] for b in blocks} == {expected.attrs["read_as"]}


def test_tsv_with_plain_quotes_in_blocks_reads_every_line(tmp_path):
    lines = [f"{'spam' if i % 5 == 0 else 'ham'}\tmessage {i}" for i in range(150)]
    lines[40] = 'ham\t"Hello" she said'  # only plain quotes read this file
    lines[90] = 'spam\tHe said "wait'
    path = tmp_path / "sms"
    path.write_text("\n".join(lines) + "\n")
    blocks = list(sources.iter_file(path, "auto", 1, 0, header=False, block_bytes=SMALL))
    got = whole(blocks)
    assert len(blocks) > 20 and len(got) == 150
    assert got["text"][40] == '"Hello" she said' and got["text"][90] == 'He said "wait'
    assert blocks[0].attrs["read_as"].endswith(
        "quotes as plain characters (quoting: auto; RFC 4180 quoting fails on line 41)")


BAD_LATE = {  # a file whose trouble sits past many blocks, and the line the message names
    "quote closed mid-field": ('t.tsv', "sentence\tlabel\n" + "ok\t1\n" * 80
                               + '"opens here\t1\nmore\t0\nends" here\t1\n', "csv",
                               "the quote that opens a field on line 82 closes on line 84"),
    "quote never closed": ('t.tsv', "sentence\tlabel\n" + "ok\t1\n" * 80 + '"never\t1\nx\t0\n',
                           "auto", "the quote opened on line 82 is never closed"),
    "ragged row": ('t.tsv', "sentence\tlabel\n" + "ok\t1\n" * 80 + "a\tb\tc\n", "auto",
                   "line 82 has 3 fields but the header has 2"),
    "broken json": ('t.jsonl', '{"sentence": "a", "label": 1}\n' * 80 + '{"sentence": \n', "auto",
                    "line 81 is not valid JSON"),
    "not utf-8": ('t.tsv', "sentence\tlabel\n" + "ok\t1\n" * 80 + "caf\udce9\t1\n", "auto",
                  "not valid UTF-8 at byte 418 (line 82)"),
}


@pytest.mark.parametrize("case", list(BAD_LATE))
def test_an_error_in_a_later_block_names_the_file_line(tmp_path, case):
    name, content, quoting, message = BAD_LATE[case]
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    read = functools.partial(sources.iter_file, path, "auto", "sentence", "label", quoting=quoting)
    with pytest.raises(ValueError) as whole_file:
        list(read())
    with pytest.raises(ValueError) as small_blocks:
        list(read(block_bytes=16))
    assert message in str(whole_file.value)
    assert str(small_blocks.value) == str(whole_file.value)


def test_parquet_and_jsonl_in_blocks(tmp_path):
    frame = pd.DataFrame({"text": [f"row {i}" for i in range(1000)],
                          "label": [["x", "y"][i % 2] for i in range(1000)]})
    pq.write_table(pa.Table.from_pandas(frame), tmp_path / "t.parquet", row_group_size=100)
    # A key the first 30 lines lack: they read as missing there, as one frame of the file has it.
    lines = [{"text": f"row {i}"} if i < 30 else {"text": f"row {i}", "label": i % 2}
             for i in range(300)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    for name, rows in (("t.parquet", 1000), ("t.jsonl", 300)):
        blocks = in_blocks(tmp_path / name, block_bytes=512)
        got = whole(blocks)
        assert len(blocks) > 10 and len(got) == rows
        assert got["row"].tolist() == list(range(rows))
        expected = read_whole(tmp_path / name, "auto", "text", "label")
        assert plain(got) == plain(expected)
    assert got["label"][:30].isna().all() and got["label"][30] == "0"


def test_a_column_no_jsonl_line_has_is_named_after_the_last_block(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}", "y": 1}) + "\n" for i in range(50)))
    with pytest.raises(ValueError, match=r"no column 'label' \(prepare.label_column\); the file "
                                         r"has 'text', 'y'"):
        in_blocks(path)


def test_empty_texts_for_predictions_are_counted_over_every_block(tmp_path):
    rows = [(f"text {i}" if i not in (30, 70, 110) else " ", "1") for i in range(120)]
    path = write_csv(tmp_path / "t.csv", rows)
    with pytest.raises(ValueError) as err:
        list(sources.iter_texts(path, "auto", "text", block_bytes=SMALL))
    assert str(err.value) == (f"{path}: data row 31 has empty text (3 such rows); fill it in or "
                              "remove the row")
    blocks = list(sources.iter_texts(write_csv(tmp_path / "ok.csv", rows[:30]), "auto", "text",
                                     block_bytes=SMALL))
    assert len(blocks) > 3 and whole(blocks)["row"].tolist() == list(range(30))


# ---------------------------------------------------------------- prepare, block by block

def prepared_both_ways(tmp_path, files: dict, cfg: PrepareConfig, **read):
    """(splits, names, report) from many small blocks and from whole frames."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    splits = {"train": cfg.train, "validation": cfg.validation, "test": cfg.test}
    paths = {split: tmp_path / name for split, name in splits.items() if name}
    columns = dict(fmt="auto", text_column=cfg.text_column, label_column=cfg.label_column, **read)
    blocks = {split: (functools.partial(sources.iter_file, path, block_bytes=SMALL, **columns),
                      str(path)) for split, path in paths.items()}
    outputs, names, report = prepare.prepare_blocks(blocks, cfg, tmp_path / "scratch")
    streamed = {split: pd.concat(list(frames), ignore_index=True)
                for split, frames in outputs.items()}
    frames = {split: (read_whole(path, **columns), str(path))
              for split, path in paths.items()}
    assert all(len(list(sources.iter_file(path, block_bytes=SMALL, **columns))) > 3
               for path in paths.values())
    return (streamed, names, report), prepare_frames(frames, cfg)


def assert_same(streamed, in_memory):
    (splits, names, report), (splits_1, names_1, report_1) = streamed, in_memory
    assert names == names_1 and report == report_1
    assert list(splits) == list(splits_1)
    for split in splits:
        pd.testing.assert_frame_equal(splits[split].map(lambda v: v.tolist() if isinstance(
            v, np.ndarray) else v), splits_1[split].map(lambda v: v.tolist() if isinstance(
                v, np.ndarray) else v))


def test_prepare_in_blocks_equals_prepare_of_whole_frames(tmp_path):
    # 400 rows of 150 texts (100 three times, 50 twice), then 2 of them with another label,
    # an empty text and a missing label.
    train = [(f"film {i % 150}", str(i % 150 % 3)) for i in range(400)]
    train += [("film 7", "2"), ("film 8", "0"), ("  ", "1"), ("no label", "NaN")]
    test = [(f"film {i}", str(i % 3)) for i in range(140, 170)]  # 10 texts train also has
    (tmp_path / "scratch").mkdir()
    write_csv(tmp_path / "test.csv", test)
    streamed, in_memory = prepared_both_ways(
        tmp_path, {"train.csv": write_csv(tmp_path / "x.csv", train).read_text()},
        PrepareConfig(train="train.csv", validation="", test="test.csv", text_column="text",
                      on_invalid="skip", on_conflict="drop", drop_duplicates=True))
    report = streamed[2]
    assert report["splits"]["train"]["conflicts"] == {
        "texts": 2, "rows": 8, "first_rows": [[8, 158, 308, 401], [9, 159, 309, 402]]}
    assert report["splits"]["train"]["dropped"] == {"empty_text": 1, "missing_label": 1,
                                                    "duplicate": 246, "conflict": 8}
    shared = report["cross_split_duplicates"]
    assert shared["test_in_train"] + shared["test_in_validation"] == 10  # film 140-149
    assert len(streamed[0]["validation"]) == 15  # 0.1 of 148 distinct texts, carved
    assert_same(streamed, in_memory)


def test_a_task_the_first_block_does_not_show_is_found_on_the_whole_split(tmp_path):
    rows = [(f"w{i}", str(i % 4)) for i in range(80)] + [(f"v{i}", f"{i % 4}.5") for i in range(40)]
    (tmp_path / "scratch").mkdir()
    streamed, in_memory = prepared_both_ways(
        tmp_path, {"train.csv": write_csv(tmp_path / "x.csv", rows).read_text()},
        PrepareConfig(train="train.csv", validation="", test="", text_column="text"))
    assert streamed[2]["task"] == "regression"
    assert streamed[2]["task_reason"] == ("every label is a number and some are not whole "
                                          "(like '0.5')")
    assert_same(streamed, in_memory)


def test_multi_label_pairs_in_blocks(tmp_path):
    labels = ["a", "b", "c", "a,b", "c, a"]
    rows = [(f"p{i % 60}", f"h{i % 7}", labels[i % 5]) for i in range(200)]
    dev = [(f"q{i}", f"h{i}", labels[i % 5]) for i in range(30)]
    (tmp_path / "scratch").mkdir()
    files = {name: write_csv(tmp_path / f"x{name}", data, header=("p", "h", "y")).read_text()
             for name, data in (("train.csv", rows), ("dev.csv", dev))}
    streamed, in_memory = prepared_both_ways(
        tmp_path, files, PrepareConfig(train="train.csv", validation="dev.csv", test="",
                                       text_column=["p", "h"], label_column="y"))
    assert streamed[2]["task"] == "multi_label" and streamed[1] == ["a", "b", "c"]
    assert streamed[0]["validation"]["label"][4].tolist() == [1.0, 0.0, 1.0]  # 'c, a'
    assert_same(streamed, in_memory)
