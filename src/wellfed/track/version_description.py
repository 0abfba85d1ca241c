"""A registered version's description, written by the champion step (track/champion.py).

The model's versions list shows each description cut to its first words, about 20 characters
(`macro_f1 0.9500 · lr 1...`, docs/mlflow.md; a description in the old form showed `Not
champion (@cham...`), beside the Aliases column (which already names the holder). So it leads
with what tells versions apart, the headline figure, then the recipe and the verdict; the
reason follows, for the version's own page:

    macro_f1 0.9500 · lr 1e-4 bs 32 · champion (@champion): eval/macro_f1 0.9500 on the test ...
    macro_f1 0.8000 · lr 3e-5 bs 16 · not champion (@champion): scored eval/macro_f1 0.8000 on ...

Descriptions written before this format (`Champion (@champion): ...`, `Not champion
(@champion): ...`) are still wellfed's own: the next evaluation rewrites them in this one. A
description someone wrote by hand is never touched.
"""

from __future__ import annotations

import re


def recipe(params: dict[str, str]) -> str:
    """`lr 1e-4 bs 32`: the knobs people change most between runs (the run title's, without the
    model name, which is long and the same across most versions), from a run's params; what is
    missing or not a number is left out."""
    shown = []
    try:
        mantissa, exponent = f"{float(params['train.lr']):e}".split("e")
        shown.append(f"lr {mantissa.rstrip('0').rstrip('.')}e{int(exponent)}")  # 1e-4, 2.5e-5
    except (KeyError, ValueError):
        pass
    if params.get("train.global_batch_size"):
        shown.append(f"bs {params['train.global_batch_size']}")
    return " ".join(shown)


def describe(reason: str, alias: str, metric: str, value: float, recipe: str = "") -> str:
    """The description of a version scored `metric` `value`, with its `recipe` (may be empty:
    versions scored before the recipe was recorded) and its `reason` (`@alias: ...` on the
    holder, `not @alias: ...` on the others). `(@alias)` in parentheses: MLflow's Markdown makes
    an `@name` after a space a link to github.com/name."""
    held = reason.startswith(f"@{alias}: ")
    why = reason.removeprefix(f"@{alias}: ") if held else reason.removeprefix(f"not @{alias}: ")
    figure = f"{metric.removeprefix('eval/')} {value:.4f}"
    return " · ".join(p for p in (figure, recipe) if p) + \
        f" · {'' if held else 'not '}{alias} (@{alias}): {why}"


def ours(description: str, alias: str) -> bool:
    """Whether a version's description is wellfed's to rewrite: empty, in this module's format,
    or headed as wellfed wrote them before it (`Champion (@champion): `, `Not champion
    (@champion): `, still in users' registries)."""
    if not description:
        return True
    old = (f"{alias[:1].upper()}{alias[1:]} (@{alias}): ", f"Not {alias} (@{alias}): ")
    name = re.escape(alias)
    return description.startswith(old) or re.match(
        rf"[^\n]* · (not )?{name} \(@{name}\): ", description) is not None
