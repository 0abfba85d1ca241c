"""How the data messages say counts, row lists and values: the readers and the checks word them
the same way."""

from __future__ import annotations

SHOWN = 5  # rows or classes a message names before "..."


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def occur(n: int) -> str:
    return "occurs" if n == 1 else "occur"


def row_list(rows, total: int | None = None) -> str:
    """'3, 17, 40' or '3, 17, 40, 52, 60, ...' (data rows are 1-based, header excluded)."""
    rows = list(rows)
    more = ", ..." if (total if total is not None else len(rows)) > SHOWN else ""
    return ", ".join(str(r) for r in rows[:SHOWN]) + more


def group_list(groups: list[list], total: int) -> str:
    """Rows of the first few texts: '12/40, 51/77/90, ...'."""
    more = ", ..." if total > len(groups) else ""
    return ", ".join("/".join(map(str, g)) for g in groups) + more


def short(value: str, limit: int = 40) -> str:
    """A value as a message quotes it: repr, cut to `limit` characters."""
    return repr(value if len(value) <= limit else value[:limit] + "...")
