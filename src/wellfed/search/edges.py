"""A winner at the edge of its range: the better recipe may lie beyond it.

A search can only draw inside `search.space`; a winner whose value sits within a few percent
of a range's end (measured on a log scale for `log_uniform`) says the range may be cut too
short, as Optuna users learn to check. Each such key is said in one line with a range to try
next: the same width (the same ratio for `log_uniform`), centred on the winner's value, so the
winner is inside it and the side it pressed against is explored. An edge the key itself does
not allow beyond (`uniform 0.0 0.2` on a ratio that cannot go below 0) is not said: the range
already reaches what the key allows. Choices are not ranges and are not judged.
"""

from __future__ import annotations

import math

from wellfed.config.search import Dimension

SHARE = 0.05
"""Within 5% of a range's width (of its log width for log_uniform) counts as at its edge."""


def position(dim: Dimension, value: float) -> float:
    """Where `value` sits in `dim`'s range: 0 at the low end, 1 at the high end."""
    if dim.kind == "log_uniform":
        return math.log(value / dim.low) / math.log(dim.high / dim.low)
    return (value - dim.low) / (dim.high - dim.low)


def next_range(dim: Dimension, value: float) -> tuple[float, float]:
    """The range to try next: `dim`'s width (or ratio) centred on `value`."""
    if dim.kind == "log_uniform":
        half = math.sqrt(dim.high / dim.low)
        return float(f"{value / half:.2g}"), float(f"{value * half:.2g}")
    half = (dim.high - dim.low) / 2
    low, high = value - half, value + half
    if dim.kind == "int":
        return math.floor(low), math.ceil(high)
    return float(f"{low:.3g}"), float(f"{high:.3g}")


def allowed(dim: Dimension, value) -> bool:
    """Whether the key's own section takes `value` (lr in (0, 1), a ratio in [0, 1), ...)."""
    from wellfed.config.loading import load_section

    section, key = dim.key.split(".", 1)
    try:
        load_section({section: {key: value}}, section)
    except ValueError:
        return False
    return True


def at_edges(dims: list[Dimension], recipe: dict, share: float = SHARE) -> list[str]:
    """One line per searched key whose winning value is within `share` of an end of its range,
    with the range to try next; [] when none is."""
    out = []
    for dim in dims:
        if dim.kind == "choice" or dim.key not in recipe:
            continue
        value = recipe[dim.key]
        where = position(dim, value)
        end = "top" if where >= 1 - share else "bottom" if where <= share else None
        if end is None:
            continue
        low, high = next_range(dim, value)
        beyond = high if end == "top" else low
        if not allowed(dim, beyond):
            continue  # the range already reaches what the key allows on that side
        gap = (1 - where) if end == "top" else where
        scale = " on a log scale" if dim.kind == "log_uniform" else ""
        near = "at" if gap < 0.005 else f"within {gap:.0%} of"
        out.append(f"the winner's {dim.key} {value:.3g} is {near} the "
                   f"{end} of its range ({dim.text()}{scale}): a better recipe may lie beyond "
                   f"it; try search.space.{dim.key}: {dim.kind} {low:g} {high:g}")
    return out
