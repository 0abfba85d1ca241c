"""One section's values checked against its dataclass and built: unknown keys with a "did you
mean", values of the wrong type, then the section's own range checks (`problems()`), every
problem collected and raised once. Knows no section by name: loading.py maps params.yaml's
sections to their classes, and search.py checks what a search may draw with the same rules."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any, Literal

from wellfed.config.numbers import number


def _type_problem(key: str, value: Any, hint: Any) -> str | None:
    """Return a message when `value` does not fit the annotation `hint`, else None."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed and str(value).lower() not in allowed:
            return f"{key} must be one of {', '.join(map(str, allowed))}; got {value!r}"
        return None
    if hint is bool:
        return None if isinstance(value, bool) else f"{key} must be true or false; got {value!r}"
    if hint is int and number(value, integer=True) is None:
        return f"{key} must be an integer; got {value!r}"
    if hint is float and number(value) is None:
        return f"{key} must be a number; got {value!r}"
    if hint is str and not isinstance(value, str):
        return f"{key} must be a string; got {value!r}"
    return None


def _coerce(value: Any, hint: Any) -> Any:
    if hint in (int, float):
        return number(value, integer=hint is int)
    if typing.get_origin(hint) is Literal and not isinstance(value, str):
        return str(value).lower()  # YAML reads `use_gpu: true` as a bool
    return value


def build(cls: type, name: str, raw: Any):
    """Section `name` of class `cls` from its params mapping `raw`; raise one ValueError listing
    every problem."""
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ValueError(f"params: section '{name}' must be a mapping; got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in raw.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f" (did you mean '{name}.{close[0]}'?)" if close else ""
            problems.append(f"unknown key '{name}.{key}'{hint}")
            continue
        problem = _type_problem(f"{name}.{key}", value, hints[key])
        if problem:
            problems.append(problem)
        else:
            values[key] = _coerce(value, hints[key])
    section = cls(**values)  # the well-typed values; range checks run on them too
    problems += section.problems() if hasattr(section, "problems") else []
    if not problems:
        return section
    raise ValueError("invalid params: " + "; ".join(problems))
