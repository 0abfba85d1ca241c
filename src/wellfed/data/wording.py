"""How the data messages say counts and values: the readers and the checks word them the same
way."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def short(value: str, limit: int = 40) -> str:
    """A value as a message quotes it: repr, cut to `limit` characters."""
    return repr(value if len(value) <= limit else value[:limit] + "...")
