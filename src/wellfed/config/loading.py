"""Loading params.yaml into the typed sections: every problem of every section collected and
raised once, as one `ValueError`."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

import yaml

from wellfed.config.fields import build
from wellfed.config.sections import SECTIONS


def load_section(params: dict, name: str):
    """Build section `name` from the params dict; raise one ValueError listing every problem."""
    return build(SECTIONS[name], name, params.get(name) or {})


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
