"""`search`: an adaptive search over the recipe (`wellfed-search`, docs/search.md): the space of
train/model keys it draws from, the figure that ranks trials, and the budget.

A distribution is one line of words, so that it reads as it is written and `dvc exp run -S`
can set it like any value: `log_uniform 1e-5 3e-4`, `uniform 0 0.2`, `int 8 64` (both ends
included) or `choice 0.0 0.01 0.1`. Every problem (an unknown key, an empty range, a value its
key refuses, a budget with no rung to stop at) is collected with the rest of params.yaml's and
said in one line by the check stage, before any trial.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from typing import Any

from wellfed.config.fields import build
from wellfed.config.numbers import number
from wellfed.config.training import ModelConfig, TrainConfig

KINDS = ("log_uniform", "uniform", "int", "choice")
SEARCHABLE: dict[str, type] = {"train": TrainConfig, "model": ModelConfig}
"""The sections a search draws recipes from, by name; their other knobs stay as params.yaml
says."""
FIXED = {
    "train.max_steps": "the budget is search.min_steps / search.max_steps",
    "train.epochs": "the budget is search.min_steps / search.max_steps",
    "train.seed": "seeds are search.seeds (the final check) and train.seed (the search)",
    "train.eval_every": "a trial validates at ASHA's rungs",
    "train.checkpoint_every": "a trial writes no checkpoint",
    "train.keep_checkpoints": "a trial writes no checkpoint",
    "train.select": "a trial is ranked at its last validation",
    "train.early_stopping_patience": "ASHA stops trials",
    "train.profile_steps": "profile the winner's run instead",
    "model.name": "a model needs its own tokens: run one search per model",
    "model.init": "a search tunes a recipe, not the initialisation",
    "model.trust_remote_code": "it is a safety switch, not a recipe",
}
"""Keys a search may not draw, and why (said in the error)."""


@dataclass(frozen=True)
class Dimension:
    """One searched key: `section.key`, its distribution and its bounds or choices."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    choices: tuple = ()

    def text(self) -> str:
        """As params.yaml writes it."""
        if self.kind == "choice":
            return "choice " + " ".join(map(str, self.choices))
        return f"{self.kind} {self.low:g} {self.high:g}"

    def edges(self) -> tuple:
        """The values that bound what the search can draw: each choice, or both ends."""
        return self.choices if self.kind == "choice" else (self.low, self.high)


def word(value: str) -> Any:
    """A choice as YAML would read it alone: true/false, a number, else the word."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    found = number(value)
    if found is not None:
        return int(found) if float(found).is_integer() and "." not in value and "e" not in \
            value.lower() else found
    return value


def parse(key: str, spec: Any, hint: Any) -> tuple[Dimension | None, str | None]:
    """`spec` (e.g. "log_uniform 1e-5 3e-4") for the key `key` of type `hint`: the Dimension,
    or one problem naming the key and the fix."""
    where = f"search.space.{key}"
    words = str(spec).split() if isinstance(spec, (str, int, float)) else None
    if not words or words[0] not in KINDS:
        return None, (f"{where} must be one of {', '.join(KINDS)} followed by its bounds or "
                      f"choices, e.g. 'log_uniform 1e-5 3e-4' or 'choice 16 32'; got {spec!r}")
    kind, rest = words[0], words[1:]
    if kind == "choice":
        if len(rest) < 2 or len(set(rest)) != len(rest):
            return None, (f"{where}: a choice needs at least two different values, e.g. "
                          f"'choice 0.0 0.01 0.1'; got {spec!r}")
        return Dimension(key, kind, choices=tuple(word(v) for v in rest)), None
    bounds = [number(v, integer=kind == "int") for v in rest]
    if len(rest) != 2 or None in bounds:
        whole = " whole" if kind == "int" else ""
        return None, f"{where}: {kind} takes two{whole} numbers, LOW HIGH; got {spec!r}"
    low, high = bounds
    if not low < high:
        return None, (f"{where}: the range {low:g}..{high:g} is empty; write the lower bound "
                      f"first, e.g. '{kind} {min(low, high):g} {max(low, high) or 1:g}'")
    if kind == "log_uniform" and low <= 0:
        return None, (f"{where}: log_uniform needs bounds above 0; got {low:g}: use uniform, "
                      "or a small positive lower bound")
    base = hint
    if typing.get_origin(hint) is typing.Union:  # int | str (micro_batch_tokens)
        base = int if int in typing.get_args(hint) else hint
    if kind == "int" and base is not int:
        return None, f"{where}: int is for whole-number keys; use uniform or log_uniform"
    if kind in ("uniform", "log_uniform") and base not in (float,):
        return None, (f"{where} is not a number that can take any value in a range; use "
                      "'choice ...'" + (" or 'int LOW HIGH'" if base is int else ""))
    return Dimension(key, kind, low, high), None


@dataclass(frozen=True)
class SearchConfig:
    """`search`: what `wellfed-search` tunes and how much compute it may spend (docs/search.md).
    Trials run the ordinary training loop, warm in Ray Tune workers; Optuna's TPE proposes each
    recipe, ASHA stops the hopeless ones at its rungs, and the best recipes are retrained over
    several seeds before the winner becomes a DVC experiment."""

    space: dict = dataclasses.field(default_factory=lambda: {"train": {
        "lr": "log_uniform 1e-5 3e-4", "warmup_ratio": "uniform 0.0 0.2",
        "weight_decay": "choice 0.0 0.01 0.1"}})
    """section -> key -> distribution, e.g. train: {lr: log_uniform 1e-5 3e-4}. Distributions:
    `log_uniform LOW HIGH`, `uniform LOW HIGH`, `int LOW HIGH` (both ends included) and
    `choice A B ...`; keys of the train and model sections (not the budget, the seed or
    model.name: search/FIXED says why)."""
    metric: str = "auto"
    """The validation figure that ranks trials: auto = the task's headline (val/macro_f1;
    regression val/pearson), or any val/* figure (val/loss and val/mse: lower is better)."""
    trials: int = 16
    """Recipes the searcher proposes (each trained until ASHA stops it or its budget ends)."""
    concurrent: int = 0
    """Trials at once: 0 = as many as the Ray cluster fits (ray.cpus_per_worker CPUs and
    ray.gpus_per_worker of a GPU each). TPE learns from finished rungs, so fewer at once
    proposes better recipes. Fused trials: groups at once (a group takes a GPU, a node's
    CPUs, or a group of one ray.cpus_per_worker)."""
    min_steps: int = 16
    """The smallest budget, in optimizer steps: ASHA's first rung, where the first trials are
    stopped. Its rungs are min_steps x reduction_factor^k up to max_steps."""
    max_steps: int = 0
    """A trial's full budget in optimizer steps (its learning-rate schedule runs to it);
    0 = what the train section plans (train.max_steps, else train.epochs)."""
    reduction_factor: int = 3
    """ASHA keeps the best 1/reduction_factor of the trials that reach each rung. On SST-2, 3
    trained 37% of the grid's steps and 2 trained 52% (docs/performance.md, "Search")."""
    finalists: int = 2
    """How many of the best recipes are retrained over `seeds` at full budget (the final
    check): the winner must beat the runner-up over seeds, or is said to be indistinguishable."""
    seeds: list = dataclasses.field(default_factory=lambda: [1, 2, 3])
    """train.seed of the final check's runs (each finalist is trained once per seed)."""
    searcher_seed: int = 0
    """Seed of the TPE searcher: the same seed, space and results propose the same recipes."""
    fuse: str = "auto"
    """Train trials fused (K trials of the model as one, train/trials/), with successive
    halving in step across the search: auto = where the space allows it (it searches only
    train.lr, weight_decay, warmup_ratio, max_grad_norm), K from the device (a GPU's memory; on
    a CPU a measured step: groups of one where fusing gains nothing, or one at a time with
    ASHA on a cluster of several nodes), else one trial at a time with ASHA, said in one line;
    true = fused (K >= 2) or a one-line error; false = one at a time with ASHA."""

    def dimensions(self) -> list[Dimension]:
        """The space as Dimensions, in params.yaml's order (assumes `problems()` is empty)."""
        out = []
        for section, keys in (self.space or {}).items():
            hints = typing.get_type_hints(SEARCHABLE[section])
            for key, spec in keys.items():
                out.append(parse(f"{section}.{key}", spec, hints[key])[0])
        return out

    def rungs(self, full: int) -> list[int]:
        """ASHA's milestones for a full budget of `full` steps, `full` last."""
        found, step = [], self.min_steps
        while step < full:
            found.append(step)
            step *= self.reduction_factor
        return found + [full]

    def problems(self) -> list[str]:
        out = self._space_problems()
        if self.trials < 1:
            out.append(f"search.trials must be >= 1; got {self.trials}")
        if self.concurrent < 0:
            out.append(f"search.concurrent must be >= 0 (0 = as many as fit); got "
                       f"{self.concurrent}")
        if self.min_steps < 1 or self.max_steps < 0:
            out.append(f"search.min_steps must be >= 1 and search.max_steps >= 0; got "
                       f"{self.min_steps} and {self.max_steps}")
        if self.reduction_factor < 2:
            out.append(f"search.reduction_factor must be >= 2 (ASHA keeps 1/reduction_factor "
                       f"at each rung); got {self.reduction_factor}")
        elif self.max_steps and self.min_steps >= 1 and \
                self.min_steps * self.reduction_factor > self.max_steps:
            out.append(f"search.max_steps {self.max_steps} leaves ASHA no rung to stop a trial "
                       f"at (it needs at least search.min_steps x search.reduction_factor = "
                       f"{self.min_steps * self.reduction_factor}); lower search.min_steps or "
                       f"raise search.max_steps")
        seeds = self.seeds if isinstance(self.seeds, list) else None
        if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) \
                or len(set(seeds)) != len(seeds):
            out.append(f"search.seeds must be a list of different whole numbers, e.g. [1, 2, 3]; "
                       f"got {self.seeds!r}")
        elif self.finalists >= 2 and len(seeds) < 2:
            out.append(f"search.seeds lists {len(seeds)} seed: telling two recipes apart over "
                       "seeds needs at least 2 (3 is the default)")
        if self.fuse not in ("auto", "true", "false"):
            out.append(f"search.fuse must be auto, true or false; got {self.fuse!r}")
        if self.finalists < 1:
            out.append(f"search.finalists must be >= 1 (2 = the winner against the runner-up); "
                       f"got {self.finalists}")
        elif self.space and self.finalists > self.trials:
            out.append(f"search.finalists {self.finalists} is more than search.trials "
                       f"{self.trials}")
        if self.metric != "auto" and not self.metric.startswith("val/"):
            out.append(f"search.metric must be auto or a validation figure like val/loss; got "
                       f"{self.metric!r}")
        return out

    def _space_problems(self) -> list[str]:
        if not isinstance(self.space, dict):
            return [f"search.space must map sections to keys, e.g. train: {{lr: log_uniform "
                    f"1e-5 3e-4}}; got {self.space!r}"]
        out = []
        for section, keys in self.space.items():
            if section not in SEARCHABLE or not isinstance(keys, dict):
                out.append(f"search.space.{section}: a search draws keys of the "
                           f"{' and '.join(SEARCHABLE)} sections, as a mapping of key to "
                           f"distribution (e.g. train: {{lr: log_uniform 1e-5 3e-4}})")
                continue
            cls = SEARCHABLE[section]
            hints = typing.get_type_hints(cls)
            known = {f.name for f in dataclasses.fields(cls)}
            for key, spec in keys.items():
                name = f"{section}.{key}"
                if key not in known:
                    close = difflib.get_close_matches(str(key), sorted(known), n=1)
                    hint = f" (did you mean '{section}.{close[0]}'?)" if close else ""
                    out.append(f"search.space: unknown key '{name}'{hint}")
                    continue
                if name in FIXED:
                    out.append(f"search.space.{name} cannot be searched: {FIXED[name]}")
                    continue
                dim, problem = parse(name, spec, hints[key])
                if problem:
                    out.append(problem)
                    continue
                for value in dim.edges():  # the section's own rules, on what can be drawn
                    try:
                        build(cls, section, {key: value})
                    except ValueError as err:
                        out.append(f"search.space.{name} can draw {value!r}, which "
                                   f"{section} refuses: "
                                   f"{str(err).removeprefix('invalid params: ')}")
                        break
        return out

    def full_steps(self, planned: int) -> int:
        """A trial's full budget, given what the train section plans (`planned` steps)."""
        return self.max_steps or planned
