"""A raw file's format: `prepare.format`, else the extension, else the content (the first 64
KiB). Content that contradicts the extension or `prepare.format` (a JSONL file named .csv,
Parquet named .tsv) is named as such rather than failing later with a parser's complaint."""

from __future__ import annotations

import json
import re
from pathlib import Path

from wellfed.data.wording import short

EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl",
              ".parquet": "parquet", ".pq": "parquet"}
NAMES = {"csv": "CSV", "tsv": "TSV", "jsonl": "JSON Lines", "parquet": "Parquet",
         "gzip": "gzip-compressed", "zip": "a zip archive", "json": "one JSON array"}
SNIFF_BYTES = 64 * 1024  # enough for ~50 lines of a typical file, read before anything else


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
    return None, f"line 1 is {short(first)}"


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

