"""Text files (CSV, TSV, JSON Lines) as UTF-8, piece by piece, so that memory holds a piece,
not the file."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Iterator


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


def decoded(path: Path, size: int) -> Iterator[str]:
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
            raise _decode_error(path, offset - bom + err.start, size) from None


def _decode_error(path: Path, at: int, size: int) -> ValueError:
    with open(path, "rb") as f:
        if f.read(2) in (b"\xff\xfe", b"\xfe\xff"):
            return ValueError(f"{path}: the file is UTF-16 (it starts with a UTF-16 byte-order "
                              "mark), not UTF-8; re-save it as UTF-8 (e.g. iconv -f utf-16 -t utf-8)")
        f.seek(0)
        line, left = 1, at
        while left > 0 and (data := f.read(min(left, size))):
            line, left = line + data.count(b"\n"), left - len(data)
    return ValueError(f"{path}: not valid UTF-8 at byte {at} (line {line}); "
                      f"re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def text_facts(path: Path, size: int) -> tuple[bool, bool]:
    """(whether the file holds a quote character, whether it holds more than whitespace). Going
    through it first also finds bytes that are not UTF-8 before any row is parsed, as reading
    the file whole did (~2 s of CPU per GB)."""
    quotes = text = False
    for piece in decoded(path, size):
        quotes = quotes or '"' in piece
        text = text or not piece.isspace()
    return quotes, text

