"""Loading params.yaml into the typed sections: every problem of every section collected and
raised once, as one `ValueError`."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from wellfed.config.numbers import number
from wellfed.config.sections import SECTIONS


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


def load_section(params: dict, name: str):
    """Build section `name` from the params dict; raise one ValueError listing every problem."""
    cls = SECTIONS[name]
    raw = params.get(name) or {}
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


def load_params(path: str | Path, *names: str) -> tuple:
    """Read params.yaml and load the named sections, collecting problems across all of them."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: params file not found; run from the project root")
    try:
        params = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({err}); fix the syntax") from None
    unknown = sorted(set(params) - set(SECTIONS))
    problems = []
    for key in unknown:
        close = difflib.get_close_matches(key, list(SECTIONS), n=1)
        problems.append(f"unknown section '{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    sections = []
    for name in names:
        try:
            sections.append(load_section(params, name))
        except ValueError as err:
            problems.append(str(err).removeprefix("invalid params: "))
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return tuple(sections)


def flatten(sections: dict[str, Any]) -> dict[str, Any]:
    """{'train': TrainConfig(...)} -> {'train.lr': 1e-4, ...} for MLflow params."""
    flat = {}
    for name, section in sections.items():
        for f in dataclasses.fields(section):
            flat[f"{name}.{f.name}"] = getattr(section, f.name)
    return flat
