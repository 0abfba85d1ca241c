"""CSV and TSV files: records block by block, how quotes are read (quoting csv, none or auto),
and the messages that say which quote breaks a file and where.

Rows come from Python's csv module fed line by line: it pulls the next line itself while a
quoted field spans lines, so a block always ends at a record boundary, and the messages stay
exact (the line a quote opened on, what follows a quote closed mid-field, quoting auto telling
such a file from RFC 4180 quoting). pyarrow's streaming CSV reader (pyarrow.csv.open_csv) would
parse faster but reads `"Hello" she said` leniently instead of failing, so auto could not see
that a file's quotes are plain characters, and its errors name neither the line a record
starts on nor where a quote opened.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from pathlib import Path
from typing import Iterator

import pandas as pd

from wellfed.data.decoding import decoded, text_facts
from wellfed.data.wording import plural, short


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
    follows = short(record[after:after + 20].split("\n")[0], 20)
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
        for piece in decoded(path, size):
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


def read_delimited(path: Path, sep: str, header: bool, quoting: str,
               size: int) -> tuple[str, list[str], Iterator[pd.DataFrame]]:
    """How a CSV/TSV file's quotes are read, warnings, and its blocks as frames of every column.

    quoting csv is RFC 4180 (a field in "..." may hold the delimiter, newlines and "" for a
    quote); none reads quotes as plain characters; auto is csv unless the file only parses with
    quotes as plain characters (a quote closed mid-field, as in `"Hello" she said`). Auto
    decides on the whole file before the first block: a file holding quotes is parsed through
    once without building rows, ~20 s of CPU per GB (a third of reading it in blocks, 63 s per
    GB); quoting csv or none skips that pass."""
    quotes, text = text_facts(path, size)
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
                        f"{path}: {plural(spans['records'], 'quoted field')} span several lines "
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

