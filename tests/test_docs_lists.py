"""Nested lists in the docs are indented 4 spaces: Python-Markdown (MkDocs) nests a list only
at 4, so a sub-bullet at 2 or 3 spaces renders as a flat item of its parent's list."""

from __future__ import annotations

import re
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
SHALLOW = re.compile(r"^ {1,3}([-*]|\d+\.) ")


def shallow_items(text: str) -> list[int]:
    """Line numbers of list items indented 1-3 spaces, outside fenced blocks."""
    found, fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and SHALLOW.match(line):
            found.append(number)
    return found


def test_the_check_sees_a_flat_sub_bullet():
    assert shallow_items("- a\n  - b\n    - c\n```\n  - code\n```\n1. d\n   - e\n") == [2, 8]


def test_every_nested_list_in_the_docs_is_indented_four_spaces():
    pages = sorted((PROJECT / "docs").rglob("*.md")) + [PROJECT / "README.md"]
    assert len(pages) >= 15
    flat = {str(p.relative_to(PROJECT)): shallow_items(p.read_text(encoding="utf-8"))
            for p in pages}
    assert not {p: lines for p, lines in flat.items() if lines}, \
        "indent these sub-bullets 4 spaces (MkDocs renders them flat)"
