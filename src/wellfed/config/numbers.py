"""Numbers as people and tools write them in params.yaml."""

from __future__ import annotations

import math
import re
from typing import Any

# A decimal number as people and tools write it: `3e-05` (how DVC's `-S train.lr=3e-5` lands in
# params.yaml), `1E-4`, `.5`, `2.`, `+1e3`. PyYAML implements YAML 1.1, whose floats need a dot and
# a signed exponent, so it loads `3e-05` and `1E-4` as strings; here they are numbers again.
NUMBER = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*")


def number(value: Any, integer: bool = False) -> int | float | None:
    """`value` as a number, or None when it is not one (a bool, a word, nan or inf).

    With `integer`, integral values count (`1e3`, `2.0` -> 1000, 2) and others do not (`2.5`)."""
    if isinstance(value, str) and NUMBER.fullmatch(value):
        value = float(value) if re.search("[.eE]", value) else int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or (integer and not value.is_integer()):
            return None
        return int(value) if integer else value
    return value if integer else float(value)


