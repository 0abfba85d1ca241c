"""Raw labelled rows from local CSV/TSV/JSONL/Parquet files or a Hugging Face Hub dataset.

Every reader returns a DataFrame with the columns `text`, `label` (labels as stripped strings, a
missing one as NA) and `row` (0-based data row in the file, header excluded), so later errors
can name the row; `frame.attrs["read_as"]` says in words how the file was read, and
`frame.attrs["warnings"]` lists what the reader could not decide for sure. Anything
unreadable becomes one ValueError naming the file, the row or byte, and the fix.

The format is decided first (formats.py); CSV and TSV are read by delimited.py, JSON Lines and
Parquet here. Files are read in blocks of about BLOCK_BYTES, so memory is bounded by a block,
not by the file.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import json
from pathlib import Path
from typing import Iterator

import pandas as pd

from wellfed import texts
from wellfed.data.columns import (column_at, has_column, listed, position,
                                  select_columns)
from wellfed.data.decoding import decoded, text_facts
from wellfed.data.delimited import read_delimited
from wellfed.data.formats import SNIFF_BYTES, detect_format
from wellfed.data.wording import short

PREPARE_KEYS = "prepare.train/validation/test"
PREDICT_KEYS = "predict.inputs (or wellfed-predict's INPUT)"  # where each reader's paths are named

BLOCK_BYTES = 8 * 2**20
"""Raw bytes per block: ~85k rows of a 100-byte-a-row CSV. A block costs ~10x its size in
Python objects while it is parsed and cleaned: preparing 1M such rows peaked at 478 MB RSS with
8 MB blocks, 759 MB with 32 MB blocks, in about the same time."""


def iter_file(path: str | Path, fmt: str, text_column, label_column, *, header: bool = True,
              quoting: str = "auto", block_bytes: int | None = None) -> Iterator[pd.DataFrame]:
    """Read one raw split file block by block: (row, text[, text_pair], label) frames of about
    `block_bytes` of the file each, `row` counted from the file's first data row; labels are
    kept as text (see `columns.label_text`). Every block's attrs carry `read_as` and
    `warnings`, which are known before the first block. Each call reads the file from its start.

    `header` and `quoting` apply to CSV/TSV; columns are names, or 0-based positions (ints or
    digit strings), which a file without a header needs; a list of two text columns is a
    sentence pair, a list of label columns several regression targets. `block_bytes` defaults
    to BLOCK_BYTES as it is when called."""
    path = Path(path)
    fmt, how, named, warnings, frames = _table(path, fmt, text_column, header, quoting,
                                               block_bytes or BLOCK_BYTES, PREPARE_KEYS)
    select = functools.partial(select_columns, where=str(path), text_column=text_column,
                               label_column=label_column, named=named)
    columns = listed(text_column) + listed(label_column)
    for block in _selected(frames, columns, select, late_keys=fmt == "jsonl"):
        block.attrs["read_as"], block.attrs["warnings"] = how, warnings
        yield block


def iter_texts(path: str | Path, fmt: str, text_column, *, header: bool = True,
               quoting: str = "auto", block_bytes: int | None = None) -> Iterator[pd.DataFrame]:
    """An unlabelled file (for predictions) block by block as (row, text[, text_pair]) frames,
    read with every check `iter_file` makes; an empty text is an error naming its row (and how
    many there are: the rest of the file is read through to count them)."""
    path = Path(path)
    fmt, how, named, warnings, frames = _table(path, fmt, text_column, header, quoting,
                                               block_bytes or BLOCK_BYTES, PREDICT_KEYS)

    def select(frame: pd.DataFrame, first_row: int) -> pd.DataFrame:
        out = {"row": range(first_row, first_row + len(frame))}
        for name, column in zip(("text", "text_pair"), listed(text_column)):
            at = column_at(frame, str(path), column, "text_column", named)
            out[name] = frame.iloc[:, at].map(lambda v: v if isinstance(v, str) else None).values
        return pd.DataFrame(out)

    blocks = _selected(frames, listed(text_column), select, late_keys=fmt == "jsonl")
    for out in blocks:
        if any(texts.empty(out[name]).any() for name in ("text", "text_pair") if name in out):
            raise _empty_text_error(path, itertools.chain([out], blocks))
        out.attrs["read_as"], out.attrs["warnings"] = how, warnings
        yield out


def _empty_text_error(path: Path, blocks) -> ValueError:
    """The first empty text of the first column that has one, and how many that column has:
    the rest of the file is read through to count them (wellfed.texts: the rule serving and
    prepare apply too)."""
    first, count = {}, {}
    for out in blocks:
        for name in ("text", "text_pair"):
            if name in out:
                empty = texts.empty(out[name])
                count[name] = count.get(name, 0) + int(empty.sum())
                if empty.any():
                    first.setdefault(name, int(out["row"].to_numpy()[empty][0]) + 1)
    name = "text" if count.get("text") else "text_pair"
    return texts.empty_error(str(path), first[name], count[name], "fill it in or remove the row")


def _table(path: Path, fmt: str, text_column, header: bool, quoting: str, size: int,
           keys: str):
    """(format, how it is read, whether columns have names, warnings, frames of every column):
    the format and the checks that need the whole file run now; frames come as they are read.
    `keys` says where the path was named, for a message that it is not a file."""
    if not path.is_file():
        raise _not_a_file(path, keys)
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    fmt, how = detect_format(path, fmt, head)
    if fmt in ("csv", "tsv"):
        used, warnings, frames = read_delimited(path, "," if fmt == "csv" else "\t", header,
                                                quoting, size)
        return fmt, f"{how}, {used}", header, warnings, frames
    if fmt == "jsonl":
        return fmt, how, True, [], _jsonl_frames(path, size)
    return fmt, how, True, [], _parquet_frames(path, listed(text_column), size)


def _selected(frames: Iterator[pd.DataFrame], columns: list, select,
              late_keys: bool) -> Iterator[pd.DataFrame]:
    """`select(frame, first_row=...)` for every block. With `late_keys` (JSON Lines) a key may
    first appear in a later block: until then its column is empty, and whether every column
    exists is settled with the keys of the whole file, after the last block."""
    first, padded, names = 0, False, []
    for frame in frames:
        names = list(frame.columns)
        missing = [c for c in columns if not has_column(names, c)] if late_keys else []
        if missing:
            padded, frame = True, frame.copy()
            for column in sorted(missing, key=lambda c: position(c) is None):  # positions first
                at = position(column)
                if at is None:
                    frame[column] = None
                else:
                    for i in range(len(frame.columns), at + 1):
                        frame[f"\x00{i}"] = None
        yield select(frame, first_row=first)
        first += len(frame)
    if padded:
        select(pd.DataFrame(columns=names), first_row=0)  # raises what one whole frame would


def _json_problem(err: json.JSONDecodeError, line: str) -> str:
    msg = err.msg[0].lower() + err.msg[1:]
    where = f"{msg} column {err.colno}" if msg.endswith(" at") else f"{msg} at column {err.colno}"
    near = line[err.pos:err.pos + 20]
    return f"{where}: {short(near, 20)}" if near.strip() else f"{where} (the end of the line)"


def _jsonl_frames(path: Path, size: int) -> Iterator[pd.DataFrame]:
    """One object per line, in blocks; each block has a column for every key seen so far, in
    the order keys first appear (as one frame of the whole file would)."""
    text_facts(path, size)  # bytes that are not UTF-8 are named before any line is parsed
    keys: dict = {}
    number, any_rows = 0, False
    for piece in decoded(path, size):
        # Split on \n only: str.splitlines() also splits on U+2028 and friends, which JSON
        # strings may hold raw.
        lines = piece.split("\n")
        if piece.endswith("\n"):
            lines.pop()  # the piece's end, not a line
        rows = []
        for line in lines:
            number += 1
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {number} is not valid JSON "
                                 f"({_json_problem(err, line)}); fix or remove that line") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {number} is a JSON {type(row).__name__}, not an "
                                 "object; each line must be one {\"text\": ..., \"label\": ...} "
                                 "object")
            rows.append(row)
        if rows:
            any_rows = True
            frame = pd.DataFrame(rows)
            keys.update(dict.fromkeys(frame.columns))
            yield frame.reindex(columns=list(keys))
    if not any_rows:
        raise ValueError(f"{path}: the file is empty; it needs one JSON object per line")


def _parquet_frames(path: Path, text_columns: list, size: int) -> Iterator[pd.DataFrame]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def unreadable(err):
        return ValueError(f"{path}: not a readable Parquet file ({err}); check the format")

    try:
        source = pq.ParquetFile(path, pre_buffer=False)  # pre-buffered reads pile up
    except (pa.ArrowInvalid, OSError) as err:
        raise unreadable(err) from None
    schema = source.schema_arrow
    names = schema.names
    for text_column in text_columns:
        if text_column not in names and str(text_column).isascii() and str(text_column).isdigit():
            text_column = names[int(text_column)] if int(text_column) < len(names) else None
        if text_column in names:
            kind = schema.field(text_column).type
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                raise ValueError(f"{path}: column '{text_column}' has type {kind}, not string; "
                                 "point prepare.text_column at the text column")
    meta = source.metadata
    raw = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    rows = max(1, size // max(1, raw // max(1, meta.num_rows)))  # rows of about `size` bytes
    try:
        batches = 0
        for batch in source.iter_batches(batch_size=rows):
            batches += 1
            yield pa.Table.from_batches([batch]).to_pandas()
    except (pa.ArrowInvalid, OSError) as err:
        raise unreadable(err) from None
    if not batches:
        yield schema.empty_table().to_pandas()


def _not_a_file(path: Path, keys: str) -> Exception:
    if path.is_dir():
        try:
            inside = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
        except OSError:
            inside = []
        held = (f"it holds {', '.join(inside[:5])}{', ...' if len(inside) > 5 else ''}" if inside
                else "it is empty")
        return ValueError(f"{path}: is a directory, not a data file ({held}); set {keys} to a "
                          "file inside it")
    hint = ""
    if path.parent.is_dir():
        close = difflib.get_close_matches(path.name, [p.name for p in path.parent.iterdir()], n=2,
                                          cutoff=0.8)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    where = " and the raw folder in dvc.yaml" if keys == PREPARE_KEYS else ""
    return FileNotFoundError(f"{path}: {'raw data' if keys == PREPARE_KEYS else 'input'} file not "
                             f"found{hint}; check {keys}{where}")


def read_hub(dataset: str, config: str, split: str, text_column, label_column) -> pd.DataFrame:
    """Read a split of a Hub dataset (needs network); label ids become their class names."""
    import datasets

    try:
        ds = datasets.load_dataset(dataset, config or None, split=split)
    except Exception as err:  # the hub client raises many types; all mean "cannot load"
        raise ValueError(f"hub dataset '{dataset}' ({config or 'default'}) split '{split}' could not "
                         f"be loaded: {type(err).__name__}: {err}. Check prepare.hub_dataset/"
                         "hub_config, the split name, and that HF_HUB_OFFLINE is not set") from None
    frame = ds.to_pandas()
    where = f"hub:{dataset}/{split}"
    for column in listed(label_column):
        label_key = frame.columns[column_at(frame, where, column, "label_column", True)]
        feature = ds.features.get(label_key)
        names = getattr(feature, "names", None)
        if names:
            # GLUE test splits carry label -1 (hidden): that is a missing label, not a class.
            frame[label_key] = frame[label_key].map(
                lambda i: names[i] if 0 <= int(i) < len(names) else None)
        names = getattr(getattr(feature, "feature", None), "names", None)
        if names:  # multi-label: a sequence of class ids (go_emotions' `labels`)
            frame[label_key] = frame[label_key].map(lambda ids: [names[int(i)] for i in ids])
    out = select_columns(frame, where, text_column, label_column)
    out.attrs["read_as"] = "Hugging Face Hub dataset"
    return out
