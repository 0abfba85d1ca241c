"""Raw labelled rows from local CSV/TSV/JSONL/Parquet files or a Hugging Face Hub dataset.

Every reader returns a DataFrame with the columns `text`, `label` (labels as stripped strings, a
missing one as NA) and `row` (0-based data row in the file, header excluded), so later errors
can name the row; `frame.attrs["read_as"]` says in words how the file was read, and
`frame.attrs["warnings"]` lists what the reader could not decide for sure. Anything
unreadable becomes one ValueError naming the file, the row or byte, and the fix.

The format is `prepare.format`, else the extension, else the content (the first 64 KiB), and
content that contradicts the extension or `prepare.format` (a JSONL file named .csv, Parquet
named .tsv) is named as such rather than failing later with a parser's complaint.
"""

from __future__ import annotations

import codecs
import csv
import difflib
import functools
import io
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl",
              ".parquet": "parquet", ".pq": "parquet"}
NAMES = {"csv": "CSV", "tsv": "TSV", "jsonl": "JSON Lines", "parquet": "Parquet",
         "gzip": "gzip-compressed", "zip": "a zip archive", "json": "one JSON array"}
SNIFF_BYTES = 64 * 1024  # enough for ~50 lines of a typical file, read before anything else


# ---------------------------------------------------------------- format: extension and content

def sniff_format(head: bytes) -> tuple[str | None, str]:
    """Guess a format from a file's first bytes: (format or None, the evidence in words).

    Besides the four readable formats it recognises gzip, zip and a JSON array ("json"), so the
    message can say what the file is."""
    for magic, fmt, what in ((b"PAR1", "parquet", "starts with the Parquet magic bytes PAR1"),
                             (b"\x1f\x8b", "gzip", "starts with the gzip magic bytes"),
                             (b"PK\x03\x04", "zip", "starts with the zip magic bytes")):
        if head.startswith(magic):
            return fmt, what
    text = head.decode("utf-8-sig", errors="replace")
    lines = text.split("\n")
    if len(head) == SNIFF_BYTES and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut by the sample
    lines = [line for line in lines if line.strip()][:50]
    if not lines:
        return None, "empty"
    first = lines[0].strip()
    if _json_object(first, cut=len(head) == SNIFF_BYTES and len(lines) == 1):
        return "jsonl", "line 1 is a JSON object"
    if re.match(r"\[\s*(\{|$)", first):  # an array of objects ('[NAME] says...' is a text)
        return "json", "it starts with '[' and an object"
    tabs = sum("\t" in line for line in lines)
    commas = sum("," in line for line in lines)
    if tabs * 2 >= len(lines):  # tabs first: commas are common inside free text
        return "tsv", f"tabs on {tabs} of the first {len(lines)} lines"
    if commas * 2 >= len(lines):
        return "csv", f"commas on {commas} of the first {len(lines)} lines"
    return None, f"line 1 is {_short(first)}"


def _json_object(line: str, cut: bool) -> bool:
    """Whether a line is a JSON object (a TSV text may start with '{' too); a line cut by the
    sample counts when it opens like one."""
    if cut:
        return re.match(r'\{\s*"', line) is not None
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _first_line(head: bytes) -> str:
    text = head.decode("utf-8-sig", errors="replace")
    return next((line for line in text.split("\n") if line.strip()), "")


def _contradiction(claimed: str, sniffed: str | None, head: bytes) -> str | None:
    """The format the content shows when it is clearly not `claimed`, else None."""
    if sniffed in ("parquet", "gzip", "zip") and sniffed != claimed:
        return sniffed
    if claimed == "parquet":
        return sniffed if sniffed in ("csv", "tsv", "jsonl", "json") else None
    if claimed == "jsonl":  # a broken first object is the JSON reader's to name
        if sniffed == "json" or not _first_line(head).lstrip().startswith(("{", "[")):
            return sniffed if sniffed in ("csv", "tsv", "json") else None
        return None
    if sniffed in ("jsonl", "json"):
        return sniffed
    first = _first_line(head)  # csv vs tsv: only when line 1 has the other delimiter alone
    if claimed == "csv" and "\t" in first and "," not in first:
        return "tsv"
    if claimed == "tsv" and "," in first and "\t" not in first:
        return "csv"
    return None


def _fix_for(path: Path, fmt: str) -> str:
    if fmt == "gzip":
        return f"decompress it first (gunzip -k {path.name}) and name the result"
    if fmt == "zip":
        return f"unzip it first (unzip {path.name}) and name the file inside"
    if fmt == "json":
        return (f"write one object per line instead (jq -c '.[]' {path.name} > "
                f"{path.stem}.jsonl) and name that file")
    return f"rename it to .{fmt} or set prepare.format: {fmt}"


def detect_format(path: Path, fmt: str, head: bytes) -> tuple[str, str]:
    """(format, how it was decided) from prepare.format, the extension or the content."""
    sniffed, evidence = sniff_format(head)
    if fmt != "auto":
        claimed, source = fmt, "prepare.format"
    else:
        claimed = EXTENSIONS.get(path.suffix.lower())
        source = f"its extension '{path.suffix}'"
    if claimed is None:
        if sniffed in ("csv", "tsv", "jsonl", "parquet"):
            return sniffed, f"{NAMES[sniffed]} from its content ({evidence})"
        if sniffed is not None:
            raise ValueError(f"{path}: the file is {NAMES[sniffed]} ({evidence}); "
                             f"{_fix_for(path, sniffed)}")
        if evidence == "empty":
            raise ValueError(f"{path}: the file is empty; it needs labelled rows")
        what = f"the extension '{path.suffix}' names none" if path.suffix else "it has no extension"
        raise ValueError(f"{path}: cannot tell the format: {what}, and the content is neither "
                         f"Parquet, JSON Lines nor tab- or comma-separated ({evidence}); "
                         "set prepare.format to one of csv, tsv, jsonl, parquet")
    other = _contradiction(claimed, sniffed, head)
    if other is not None:
        if other not in ("csv", "tsv") or sniffed == other:
            shown = evidence
        else:
            shown = f"line 1 has {'tabs' if other == 'tsv' else 'commas'} and no " \
                    f"{'commas' if other == 'tsv' else 'tabs'}"
        raise ValueError(f"{path}: the content is {NAMES[other]} ({shown}), not "
                         f"{NAMES[claimed]} as {source} says; {_fix_for(path, other)}")
    how = f"prepare.format: {fmt}" if fmt != "auto" else f"from the extension {path.suffix}"
    return claimed, f"{NAMES[claimed]} ({how})"


# ---------------------------------------------------------------- text files, block by block
#
# Files are read in blocks of about BLOCK_BYTES, so memory is bounded by a block, not by the
# file. CSV/TSV rows come from Python's csv module fed line by line: it pulls the next line
# itself while a quoted field spans lines, so a block always ends at a record boundary, and the
# messages stay exact (the line a quote opened on, what follows a quote closed mid-field, quoting
# auto telling such a file from RFC 4180 quoting). pyarrow's streaming CSV reader
# (pyarrow.csv.open_csv) would parse faster but reads `"Hello" she said` leniently instead of
# failing, so auto could not see that a file's quotes are plain characters, and its errors name
# neither the line a record starts on nor where a quote opened.

BLOCK_BYTES = 8 * 2**20
"""Raw bytes per block: ~85k rows of a 100-byte-a-row CSV. A block costs ~10x its size in
Python objects while it is parsed and cleaned: preparing 1M such rows peaked at 478 MB RSS with
8 MB blocks, 759 MB with 32 MB blocks, in about the same time."""


def _short(value: str, limit: int = 40) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _pieces(path: Path, size: int) -> Iterator[tuple[int, bytes]]:
    """(byte offset, bytes) of about `size` bytes each, ending just after a newline (the last
    where the file ends): no line and no UTF-8 character is cut."""
    with open(path, "rb") as f:
        offset, carry = 0, b""
        while data := f.read(size):
            data = carry + data
            cut = data.rfind(b"\n") + 1
            if cut:  # else a line longer than `size`: read on until it ends
                yield offset, data[:cut]
                offset, data = offset + cut, data[cut:]
            carry = data
        if carry:
            yield offset, carry


def _decoded(path: Path, size: int) -> Iterator[str]:
    """The file as UTF-8 text, piece by piece, a leading byte-order mark dropped; the first
    bytes that are not UTF-8 are one ValueError naming the byte and the line."""
    bom = 0
    for offset, data in _pieces(path, size):
        if offset == 0 and data.startswith(codecs.BOM_UTF8):
            bom, data, offset = len(codecs.BOM_UTF8), data[len(codecs.BOM_UTF8):], len(codecs.BOM_UTF8)
        try:
            yield data.decode("utf-8")
        except UnicodeDecodeError as err:
            # Counted after the mark, as decoding the whole file with utf-8-sig does.
            raise _decode_error(path, offset - bom + err.start) from None


def _decode_error(path: Path, at: int) -> ValueError:
    with open(path, "rb") as f:
        if f.read(2) in (b"\xff\xfe", b"\xfe\xff"):
            return ValueError(f"{path}: the file is UTF-16 (it starts with a UTF-16 byte-order "
                              "mark), not UTF-8; re-save it as UTF-8 (e.g. iconv -f utf-16 -t utf-8)")
        f.seek(0)
        line, left = 1, at
        while left > 0 and (data := f.read(min(left, BLOCK_BYTES))):
            line, left = line + data.count(b"\n"), left - len(data)
    return ValueError(f"{path}: not valid UTF-8 at byte {at} (line {line}); "
                      f"re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def _text_facts(path: Path, size: int) -> tuple[bool, bool]:
    """(whether the file holds a quote character, whether it holds more than whitespace). Going
    through it first also finds bytes that are not UTF-8 before any row is parsed, as reading
    the file whole did (~2 s of CPU per GB)."""
    quotes = text = False
    for piece in _decoded(path, size):
        quotes = quotes or '"' in piece
        text = text or not piece.isspace()
    return quotes, text


class _Unparsable(Exception):
    """One way of reading a delimited file failed: str() is the message for the user, `line`
    the line it names, `kind` one of unclosed (a quote never closed), quote (a quote closed
    mid-field), ragged (a row of the wrong width) or other."""

    def __init__(self, message: str, line: int, kind: str):
        super().__init__(message)
        self.line, self.kind = line, kind


_BREAK = re.compile(r"\r\n|\r|\n")  # line breaks as csv counts them (universal newlines)


def _line_of(text: str, pos: int) -> int:
    return len(_BREAK.findall(text, 0, pos)) + 1


def _quote_trouble(text: str, sep: str, line: int) -> tuple[str, int, int] | None:
    """Re-read the record that starts on `line` the way RFC 4180 does and find the quote that
    breaks it: ("eof", opened_at, -1) for a quote never closed, ("closed", opened_at, after)
    for one closed and followed by text. Positions are offsets into `text`."""
    pos = 0
    for _ in range(line - 1):
        found = _BREAK.search(text, pos)
        if found is None:
            return None
        pos = found.end()
    field_end = re.compile(f"[{re.escape(sep)}\r\n]")
    while True:
        if text.startswith('"', pos):
            opened, end = pos, pos + 1
            while True:
                close = text.find('"', end)
                if close < 0:
                    return "eof", opened, -1
                if not text.startswith('"', close + 1):
                    break
                end = close + 2  # "" is a quote inside the field
            after = close + 1
            if after >= len(text) or text[after] in "\r\n":
                return None
            if text[after] != sep:
                return "closed", opened, after
            pos = after + 1
            continue
        found = field_end.search(text, pos)  # a quote inside an unquoted field is literal
        if found is None or found.group() != sep:
            return None
        pos = found.end()


def _quote_problem(path: Path, record: str, first: int, sep: str, kind: str,
                   err: csv.Error) -> _Unparsable:
    """The message for a record csv could not read: `record` is its text so far (to the end of
    the file for a quote never closed), starting on line `first`."""
    trouble = _quote_trouble(record, sep, 1)
    if trouble is None:
        return _Unparsable(f"{path}: cannot parse as {kind} at line {first} ({err})", first,
                           "other")
    what, opened, after = trouble
    at = first - 1 + _line_of(record, opened)
    if what == "eof":
        return _Unparsable(f"{path}: cannot parse as {kind}: the quote opened on line {at} is "
                           "never closed (the file ends inside it); close it", at, "unclosed")
    closes = first - 1 + _line_of(record, after)
    where = "on the same line" if closes == at else f"on line {closes}"
    follows = _short(record[after:after + 20].split("\n")[0], 20)
    delimiter = "a tab" if sep == "\t" else "a comma"
    return _Unparsable(f"{path}: cannot parse as {kind}: the quote that opens a field on line {at} "
                       f"closes {where} and is followed by {follows} instead of {delimiter} or "
                       "the line end; inside a quoted field write a quote as two (\"\")", at,
                       "quote")


def _records(path: Path, sep: str, quoted: bool, header: bool, size: int,
             spans: dict | None = None) -> Iterator[list[list[str]]]:
    """The file's non-blank rows, each as long as the first, in blocks of about `size`
    characters; `spans` counts the records that span several lines (and the line the first
    starts on). _Unparsable names the line otherwise."""
    kind = "TSV" if sep == "\t" else "CSV"
    record: list[str] = []  # the lines of the record being read, for a message about it
    read = [0]

    def lines() -> Iterator[str]:
        for piece in _decoded(path, size):
            for line in io.StringIO(piece, newline=""):  # splits as csv expects (\r, \n, \r\n)
                record.append(line)
                read[0] += len(line)
                yield line

    reader = csv.reader(lines(), delimiter=sep, strict=quoted,
                        quoting=csv.QUOTE_MINIMAL if quoted else csv.QUOTE_NONE)
    rows: list[list[str]] = []
    width, start = None, 1  # start: the line the current record starts on
    try:
        for row in reader:
            if row:  # blank lines are skipped
                if width is None:
                    width = len(row)
                elif len(row) != width:
                    first = "the header" if header else "line 1"
                    fix = ("quote fields that contain the delimiter, or fix that row" if quoted
                           else "with prepare.quoting: none a delimiter inside a text cannot be "
                           "quoted; remove it from that row, or quote it and set quoting: csv")
                    raise _Unparsable(f"{path}: line {start} has {len(row)} fields but {first} "
                                      f"has {width}; {fix}", start, "ragged")
                rows.append(row)
                if spans is not None and reader.line_num > start:
                    spans["records"] += 1
                    spans["first"] = spans["first"] or start
            start = reader.line_num + 1
            record.clear()
            if read[0] >= size:
                yield rows
                rows, read[0] = [], 0
    except csv.Error as err:
        raise _quote_problem(path, "".join(record), start, sep, kind, err) from None
    yield rows


def _count_rows(path: Path, sep: str, quoted: bool, header: bool, size: int,
                spans: dict | None = None) -> int:
    return sum(len(rows) for rows in _records(path, sep, quoted, header, size, spans))


_NONE_HINT = ", or set prepare.quoting: none if quotes in this file are plain characters"


def _hint(quoting: str, err: _Unparsable) -> str:
    return _NONE_HINT if quoting != "none" and err.kind in ("unclosed", "quote") else ""


def _delimited(path: Path, sep: str, header: bool, quoting: str,
               size: int) -> tuple[str, list[str], Iterator[pd.DataFrame]]:
    """How a CSV/TSV file's quotes are read, warnings, and its blocks as frames of every column.

    quoting csv is RFC 4180 (a field in "..." may hold the delimiter, newlines and "" for a
    quote); none reads quotes as plain characters; auto is csv unless the file only parses with
    quotes as plain characters (a quote closed mid-field, as in `"Hello" she said`). Auto
    decides on the whole file before the first block: a file holding quotes is parsed through
    once without building rows, ~20 s of CPU per GB (a third of reading it in blocks, 63 s per
    GB); quoting csv or none skips that pass."""
    quotes, text = _text_facts(path, size)
    if not text:
        needs = "a header row and data rows" if header else "data rows"
        raise ValueError(f"{path}: the file is empty; it needs {needs}")
    csv.field_size_limit(sys.maxsize)  # the default 131,072 chars rejects long texts
    quoted, used, warnings = quoting != "none", "quotes as in RFC 4180 (quoting: csv)", []
    if quoting == "none":
        used = "quotes as plain characters (quoting: none)"
    elif quoting == "auto" and not quotes:
        used = "no quotes in the file"
    elif quoting == "auto":
        used, spans = "quotes as in RFC 4180 (quoting: auto)", {"records": 0, "first": None}
        try:
            rows = _count_rows(path, sep, True, header, size, spans)
        except _Unparsable as err:
            # Plain quotes are tried when RFC 4180 fails on a quote closed mid-field or a ragged
            # row; a quote never closed is reported as that (the file may be cut short).
            if err.kind in ("unclosed", "other"):
                raise ValueError(f"{err}{_hint(quoting, err)}") from None
            try:
                _count_rows(path, sep, False, header, size)
            except _Unparsable as plain:
                raise ValueError(f"{err}; read with quotes as plain characters (quoting: none) "
                                 f"it fails too: {str(plain).removeprefix(f'{path}: ')}") from None
            quoted = False
            used = ("quotes as plain characters (quoting: auto; RFC 4180 quoting fails on line "
                    f"{err.line})")
        else:
            if spans["records"]:
                # Quoted fields span lines: real multi-line texts, or a plain quote that
                # swallowed whole rows. Both read cleanly when every line is also a complete
                # row on its own; RFC 4180 stays, and the user is told how to read it the other
                # way.
                try:
                    plain = _count_rows(path, sep, False, header, size)
                except _Unparsable:
                    plain = 0
                if plain > rows:
                    warnings.append(
                        f"{path}: {_plural(spans['records'], 'quoted field')} span several lines "
                        f"(the first starts on line {spans['first']}), giving {rows} rows; read "
                        f"with quotes as plain characters every line is a row of its own ({plain} "
                        "rows). If quotes in this file are plain characters, set "
                        "prepare.quoting: none")
    how = ("with a header line" if header else "no header line") + f", {used}"
    return how, warnings, _delimited_frames(path, sep, quoted, header, quoting, size)


def _delimited_frames(path: Path, sep: str, quoted: bool, header: bool, quoting: str,
                      size: int) -> Iterator[pd.DataFrame]:
    names, rows_seen = None, False
    try:
        for rows in _records(path, sep, quoted, header, size):
            if header and names is None and rows:
                names, rows = rows[0], rows[1:]
            if rows:
                rows_seen = True
                yield pd.DataFrame(rows, columns=names, dtype=object)
    except _Unparsable as err:
        raise ValueError(f"{err}{_hint(quoting, err)}") from None
    if not rows_seen:  # a header alone: its columns, no rows
        yield pd.DataFrame([], columns=names, dtype=object)


def _plural(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else word + 's'}"


def _json_problem(err: json.JSONDecodeError, line: str) -> str:
    msg = err.msg[0].lower() + err.msg[1:]
    where = f"{msg} column {err.colno}" if msg.endswith(" at") else f"{msg} at column {err.colno}"
    near = line[err.pos:err.pos + 20]
    return f"{where}: {_short(near, 20)}" if near.strip() else f"{where} (the end of the line)"


def _jsonl_frames(path: Path, size: int) -> Iterator[pd.DataFrame]:
    """One object per line, in blocks; each block has a column for every key seen so far, in
    the order keys first appear (as one frame of the whole file would)."""
    _text_facts(path, size)  # bytes that are not UTF-8 are named before any line is parsed
    keys: dict = {}
    number, any_rows = 0, False
    for piece in _decoded(path, size):
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


def _not_a_file(path: Path) -> Exception:
    if path.is_dir():
        try:
            inside = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
        except OSError:
            inside = []
        held = (f"it holds {', '.join(inside[:5])}{', ...' if len(inside) > 5 else ''}" if inside
                else "it is empty")
        return ValueError(f"{path}: is a directory, not a data file ({held}); set prepare.train/"
                          "validation/test to a file inside it")
    hint = ""
    if path.parent.is_dir():
        close = difflib.get_close_matches(path.name, [p.name for p in path.parent.iterdir()], n=2,
                                          cutoff=0.8)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    return FileNotFoundError(f"{path}: raw data file not found{hint}; check prepare.train/"
                             "validation/test and the raw folder in dvc.yaml")


def iter_file(path: str | Path, fmt: str, text_column, label_column, *, header: bool = True,
              quoting: str = "auto", block_bytes: int | None = None) -> Iterator[pd.DataFrame]:
    """Read one raw split file block by block: (row, text[, text_pair], label) frames of about
    `block_bytes` of the file each, `row` counted from the file's first data row; labels are
    kept as text (see `label_text`). Every block's attrs carry `read_as` and `warnings`, which
    are known before the first block. Each call reads the file from its start.

    `header` and `quoting` apply to CSV/TSV; columns are names, or 0-based positions (ints or
    digit strings), which a file without a header needs; a list of two text columns is a
    sentence pair, a list of label columns several regression targets. `block_bytes` defaults
    to BLOCK_BYTES as it is when called."""
    path = Path(path)
    fmt, how, named, warnings, frames = _table(path, fmt, text_column, header, quoting,
                                               block_bytes or BLOCK_BYTES)
    select = functools.partial(select_columns, where=str(path), text_column=text_column,
                               label_column=label_column, named=named)
    columns = _listed(text_column) + _listed(label_column)
    for block in _selected(frames, columns, select, late_keys=fmt == "jsonl"):
        block.attrs["read_as"], block.attrs["warnings"] = how, warnings
        yield block


def read_file(path: str | Path, fmt: str, text_column, label_column, *,
              header: bool = True, quoting: str = "auto") -> pd.DataFrame:
    """The whole file as one frame (`iter_file`'s blocks put together)."""
    return _whole(iter_file(path, fmt, text_column, label_column, header=header, quoting=quoting))


def iter_texts(path: str | Path, fmt: str, text_column, *, header: bool = True,
               quoting: str = "auto", block_bytes: int | None = None) -> Iterator[pd.DataFrame]:
    """An unlabelled file (for predictions) block by block as (row, text[, text_pair]) frames,
    read with every check `iter_file` makes; an empty text is an error naming its row (and how
    many there are: the rest of the file is read through to count them)."""
    path = Path(path)
    fmt, how, named, warnings, frames = _table(path, fmt, text_column, header, quoting,
                                               block_bytes or BLOCK_BYTES)

    def select(frame: pd.DataFrame, first_row: int) -> pd.DataFrame:
        out = {"row": range(first_row, first_row + len(frame))}
        for name, column in zip(("text", "text_pair"), _listed(text_column)):
            at = _column(frame, str(path), column, "text_column", named)
            out[name] = frame.iloc[:, at].map(lambda v: v if isinstance(v, str) else None).values
        return pd.DataFrame(out)

    blocks = _selected(frames, _listed(text_column), select, late_keys=fmt == "jsonl")
    for out in blocks:
        if any(_empty(out[name]).any() for name in ("text", "text_pair") if name in out):
            raise _empty_text_error(path, itertools.chain([out], blocks))
        out.attrs["read_as"], out.attrs["warnings"] = how, warnings
        yield out


def _empty(texts: pd.Series) -> pd.Series:
    return texts.isna() | (texts.fillna("").str.strip() == "")


def _empty_text_error(path: Path, blocks) -> ValueError:
    """The first empty text of the first column that has one, and how many that column has:
    the rest of the file is read through to count them."""
    first, count = {}, {}
    for out in blocks:
        for name in ("text", "text_pair"):
            if name in out:
                empty = _empty(out[name])
                count[name] = count.get(name, 0) + int(empty.sum())
                if empty.any():
                    first.setdefault(name, int(out.loc[empty, "row"].iloc[0]) + 1)
    name = "text" if count.get("text") else "text_pair"
    n = count[name]
    return ValueError(f"{path}: data row {first[name]} has empty text ({n} such "
                      f"row{'s' if n > 1 else ''}); fill it in or remove the row")


def read_texts(path: str | Path, fmt: str, text_column, *, header: bool = True,
               quoting: str = "auto") -> pd.DataFrame:
    """The whole unlabelled file as one frame (`iter_texts`' blocks put together)."""
    return _whole(iter_texts(path, fmt, text_column, header=header, quoting=quoting))


def _whole(blocks: Iterator[pd.DataFrame]) -> pd.DataFrame:
    blocks = list(blocks)
    frame = blocks[0] if len(blocks) == 1 else pd.concat(blocks, ignore_index=True)
    frame.attrs = dict(blocks[0].attrs)
    return frame


def _table(path: Path, fmt: str, text_column, header: bool, quoting: str, size: int):
    """(format, how it is read, whether columns have names, warnings, frames of every column):
    the format and the checks that need the whole file run now; frames come as they are read."""
    if not path.is_file():
        raise _not_a_file(path)
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    fmt, how = detect_format(path, fmt, head)
    if fmt in ("csv", "tsv"):
        used, warnings, frames = _delimited(path, "," if fmt == "csv" else "\t", header, quoting,
                                            size)
        return fmt, f"{how}, {used}", header, warnings, frames
    if fmt == "jsonl":
        return fmt, how, True, [], _jsonl_frames(path, size)
    return fmt, how, True, [], _parquet_frames(path, _listed(text_column), size)


def _selected(frames: Iterator[pd.DataFrame], columns: list, select,
              late_keys: bool) -> Iterator[pd.DataFrame]:
    """`select(frame, first_row=...)` for every block. With `late_keys` (JSON Lines) a key may
    first appear in a later block: until then its column is empty, and whether every column
    exists is settled with the keys of the whole file, after the last block."""
    first, padded, names = 0, False, []
    for frame in frames:
        names = list(frame.columns)
        missing = [c for c in columns if not _has_column(names, c)] if late_keys else []
        if missing:
            padded, frame = True, frame.copy()
            for column in sorted(missing, key=lambda c: _position(c) is None):  # positions first
                position = _position(column)
                if position is None:
                    frame[column] = None
                else:
                    for i in range(len(frame.columns), position + 1):
                        frame[f"\x00{i}"] = None
        yield select(frame, first_row=first)
        first += len(frame)
    if padded:
        select(pd.DataFrame(columns=names), first_row=0)  # raises what one whole frame would


def _position(column) -> int | None:
    if isinstance(column, int):
        return column
    return int(column) if column.isascii() and column.isdigit() else None


def _has_column(names: list, column) -> bool:
    """Whether `_column` finds `column` among named columns `names`."""
    if isinstance(column, str) and column in [str(n) for n in names]:
        return True
    position = _position(column)
    return position is not None and position < len(names)


# ---------------------------------------------------------------- columns and labels

def _column(frame: pd.DataFrame, where: str, column: str | int, key: str, named: bool) -> int:
    """The position of the frame's column that `column` (a name, or a 0-based position) picks."""
    columns = list(frame.columns)
    shown = [str(c) for c in columns]
    if isinstance(column, str) and named and column in shown:
        if shown.count(column) > 1:
            at = [i for i, c in enumerate(shown) if c == column]
            raise ValueError(f"{where}: the header names {column!r} {len(at)} times (positions "
                             f"{', '.join(map(str, at))}); rename one, or set prepare.{key} to "
                             "the 0-based position of the one you mean")
        return shown.index(column)
    digits = isinstance(column, str) and column.isascii() and column.isdigit()
    position = column if isinstance(column, int) else int(column) if digits else None
    if position is not None:
        if position < len(columns):
            return position
        raise ValueError(f"{where}: prepare.{key} is position {position}, but the rows have "
                         f"{len(columns)} fields (positions 0 to {len(columns) - 1}); set it "
                         "to one of those")
    if not named:
        fields = ", ".join(f"{i} {_short(str(v), 20)}" for i, v in
                           enumerate(frame.iloc[0].tolist() if len(frame) else []))
        raise ValueError(f"{where}: prepare.{key} is {column!r}, but with prepare.header: false "
                         f"the columns have no names; set it to a 0-based position (line 1: "
                         f"{fields})")
    close = difflib.get_close_matches(column, shown, n=2, cutoff=0.4)
    listed = ", ".join(_short(c) for c in shown[:20]) + (", ..." if len(shown) > 20 else "")
    if close:
        fix = (f" (did you mean {' or '.join(repr(c) for c in close)}?); set prepare.{key} to "
               "one of them")
    else:
        fix = (f"; set prepare.{key} to one of them or, if line 1 is data rather than column "
               "names, set prepare.header: false and give the columns as 0-based positions")
    raise ValueError(f"{where}: no column '{column}' (prepare.{key}); the file has {listed}{fix}")


def _listed(columns) -> list:
    return list(columns) if isinstance(columns, (list, tuple)) else [columns]


def label_text(value) -> str | tuple | None:
    """A label as a stripped string; None for a missing one. A float label that is a whole
    number (1.0: an integer column with a gap, as pandas and Parquet store it) is written 1.
    A list (multi-label in JSONL/Parquet) is a tuple of such strings, missing ones left out."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(t for t in map(label_text, value) if t is not None)
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float):
        if value != value:
            return None
        if value.is_integer():
            value = int(value)
    return str(value).strip() or None


def select_columns(frame: pd.DataFrame, where: str, text_column, label_column,
                   named: bool = True, first_row: int = 0) -> pd.DataFrame:
    """(row, text[, text_pair], label): one text column or a pair; one label column, or
    several (regression targets) whose texts make a tuple per row. `row` starts at `first_row`
    (a block's place in its file)."""
    text_at = [_column(frame, where, c, "text_column", named) for c in _listed(text_column)]
    label_at = [_column(frame, where, c, "label_column", named) for c in _listed(label_column)]
    both = set(text_at) & set(label_at)
    if both or len(set(text_at)) < len(text_at):
        raise ValueError(f"{where}: prepare.text_column ({text_column!r}) and prepare.label_column "
                         f"({label_column!r}) pick the same column; point them at "
                         "different ones")
    # Missing labels stay None (or their spelling, e.g. 'NaN') so that `prepare` can count or
    # reject them by row.
    if len(label_at) == 1:
        labels = frame.iloc[:, label_at[0]].map(label_text).values
    else:
        parts = [frame.iloc[:, at].map(label_text) for at in label_at]
        labels = [None if None in row else row for row in zip(*parts)]
    out = {"row": range(first_row, first_row + len(frame))}
    for name, at in zip(("text", "text_pair"), text_at):
        out[name] = frame.iloc[:, at].map(lambda v: v if isinstance(v, str) else None).values
    out["label"] = labels
    return pd.DataFrame(out)


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
    for column in _listed(label_column):
        label_key = frame.columns[_column(frame, where, column, "label_column", True)]
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
