"""Raw labelled rows from local CSV/TSV/JSONL/Parquet files or a Hugging Face Hub dataset.

Every reader returns a DataFrame with the columns `text`, `label` (both as read, labels as
strings) and `row` (0-based data row in the file, header excluded), so later errors can name the
row. Anything unreadable becomes one ValueError naming the file, the row or byte, and the fix.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
from pathlib import Path

import pandas as pd

EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl",
              ".parquet": "parquet", ".pq": "parquet"}


def detect_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    found = EXTENSIONS.get(path.suffix.lower())
    if found is None:
        raise ValueError(f"{path}: cannot tell the format from the extension '{path.suffix}'; "
                         f"set prepare.format to one of csv, tsv, jsonl, parquet")
    return found


def _missing_column(path: Path, column: str, key: str, columns: list[str]) -> ValueError:
    close = difflib.get_close_matches(column, [str(c) for c in columns], n=2, cutoff=0.4)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(f"{path}: no column '{column}' (prepare.{key}); the file has "
                      f"{', '.join(map(repr, columns))}{hint} Set prepare.{key} to one of them")


def _decode_error(path: Path, data: bytes, err: UnicodeDecodeError) -> ValueError:
    line = data.count(b"\n", 0, err.start) + 1
    return ValueError(f"{path}: not valid UTF-8 at byte {err.start} (line {line}); "
                      f"re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")  # a UTF-8 byte-order mark is fine, and stripped
    except UnicodeDecodeError as err:
        raise _decode_error(path, data, err) from None


def _read_delimited(path: Path, sep: str) -> pd.DataFrame:
    """RFC 4180 quoting (quoted fields may hold the delimiter, quotes and newlines); every row
    must have as many fields as the header: a ragged row is an error naming its line."""
    text = _read_text(path)
    if not text.strip():
        raise ValueError(f"{path}: the file is empty; it needs a header row and data rows")
    kind = "TSV" if sep == "\t" else "CSV"
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=sep, quoting=csv.QUOTE_MINIMAL,
                        strict=True)
    try:
        header = next(reader)
        rows = []
        for row in reader:
            if len(row) != len(header):
                if not row:  # a blank line
                    continue
                raise ValueError(f"{path}: line {reader.line_num} has {len(row)} fields but the "
                                 f"header has {len(header)}; quote fields that contain the "
                                 f"delimiter, or fix that row")
            rows.append(row)
    except csv.Error as err:
        raise ValueError(f"{path}: cannot parse as {kind} at line {reader.line_num} ({err}); "
                         "check that row for an unclosed quote") from None
    return pd.DataFrame(rows, columns=header, dtype=object)


def _read_jsonl(path: Path) -> pd.DataFrame:
    rows = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {number} is not valid JSON ({err.msg}); "
                             "fix or remove that line") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {number} is a JSON {type(row).__name__}, not an object; "
                             "each line must be one {\"text\": ..., \"label\": ...} object")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: the file is empty; it needs one JSON object per line")
    return pd.DataFrame(rows)


def _read_parquet(path: Path, text_column: str) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(f"{path}: not a readable Parquet file ({err}); check the format") from None
    if text_column in table.column_names:
        kind = table.schema.field(text_column).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise ValueError(f"{path}: column '{text_column}' has type {kind}, not string; "
                             "point prepare.text_column at the text column")
    return table.to_pandas()


def read_file(path: str | Path, fmt: str, text_column: str, label_column: str) -> pd.DataFrame:
    """Read one raw split file into a (row, text, label) frame; labels are kept as strings."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: raw data file not found; check prepare.train/"
                                "validation/test and the raw folder in dvc.yaml")
    fmt = detect_format(path, fmt)
    if fmt == "csv":
        frame = _read_delimited(path, ",")
    elif fmt == "tsv":
        frame = _read_delimited(path, "\t")
    elif fmt == "jsonl":
        frame = _read_jsonl(path)
    else:
        frame = _read_parquet(path, text_column)
    return select_columns(frame, str(path), text_column, label_column)


def select_columns(frame: pd.DataFrame, where: str, text_column: str,
                   label_column: str) -> pd.DataFrame:
    columns = [str(c) for c in frame.columns]
    for column, key in ((text_column, "text_column"), (label_column, "label_column")):
        if column not in columns:
            raise _missing_column(Path(where), column, key, columns)
    labels = frame[label_column]
    # Missing labels stay None so that `prepare` can count or reject them by row.
    labels = labels.map(lambda v: None if v is None or (isinstance(v, float) and v != v)
                        else str(v).strip() or None)
    texts = frame[text_column].map(lambda v: v if isinstance(v, str) else None)
    return pd.DataFrame({"row": range(len(frame)), "text": texts.values, "label": labels.values})


def read_hub(dataset: str, config: str, split: str, text_column: str,
             label_column: str) -> pd.DataFrame:
    """Read a split of a Hub dataset (needs network); label ids become their class names."""
    import datasets

    try:
        ds = datasets.load_dataset(dataset, config or None, split=split)
    except Exception as err:  # the hub client raises many types; all mean "cannot load"
        raise ValueError(f"hub dataset '{dataset}' ({config or 'default'}) split '{split}' could not "
                         f"be loaded: {type(err).__name__}: {err}. Check prepare.hub_dataset/"
                         "hub_config, the split name, and that HF_HUB_OFFLINE is not set") from None
    frame = ds.to_pandas()
    feature = ds.features.get(label_column)
    names = getattr(feature, "names", None)
    if names and label_column in frame:
        # GLUE test splits carry label -1 (hidden): that is a missing label, not a class.
        frame[label_column] = frame[label_column].map(
            lambda i: names[i] if 0 <= int(i) < len(names) else None)
    return select_columns(frame, f"hub:{dataset}/{split}", text_column, label_column)
