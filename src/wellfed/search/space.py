"""From `search.space` to what Optuna draws, and from a drawn recipe back to the typed train and
model sections a trial (and later the winner's `dvc exp run`) trains with.

A recipe is a flat dict of `section.key` -> value, e.g. {"train.lr": 3.1e-5, "train.warmup_ratio":
0.08}: the names `dvc exp run -S` takes, the MLflow params of a trial, and the search's JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

from wellfed.config import ModelConfig, SearchConfig, TrainConfig
from wellfed.config.search import Dimension
from wellfed.data.batching import steps_per_epoch


def optuna_space(dims: list[Dimension]) -> dict:
    """The space as Optuna distributions, by `section.key` (OptunaSearch's define-by-space)."""
    import optuna.distributions as od

    space = {}
    for d in dims:
        if d.kind == "choice":
            space[d.key] = od.CategoricalDistribution(list(d.choices))
        elif d.kind == "int":
            space[d.key] = od.IntDistribution(int(d.low), int(d.high))
        else:
            space[d.key] = od.FloatDistribution(float(d.low), float(d.high),
                                                log=d.kind == "log_uniform")
    return space


def rounded(recipe: dict) -> dict:
    """A drawn recipe with its floats cut to 4 significant digits (numpy scalars made plain):
    what the trial trains is exactly what params.yaml and `dvc exp run -S` will say."""
    out = {}
    for key, value in recipe.items():
        value = value.item() if hasattr(value, "item") else value
        out[key] = float(f"{value:.4g}") if isinstance(value, float) else value
    return out


def typed(value, current):
    """`value` as the type the section holds now (Optuna hands numpy scalars and floats)."""
    if isinstance(current, bool):
        return bool(value)
    if isinstance(current, int) and not isinstance(value, str):
        return int(round(float(value)))
    if isinstance(current, float) and not isinstance(value, str):
        return float(value)
    return value.item() if hasattr(value, "item") else value


def applied(recipe: dict, train: TrainConfig, model: ModelConfig) -> tuple[TrainConfig, ModelConfig]:
    """The train and model sections with `recipe`'s values in place."""
    changes: dict[str, dict] = {"train": {}, "model": {}}
    for name, value in recipe.items():
        section, key = name.split(".", 1)
        changes[section][key] = typed(value, getattr(train if section == "train" else model, key))
    return (dataclasses.replace(train, **changes["train"]),
            dataclasses.replace(model, **changes["model"]))


def budgeted(train: TrainConfig, rows: int, full: int, seed: int) -> TrainConfig:
    """`train` as a trial runs it: `full` optimizer steps (enough epochs to hold them; the
    learning-rate schedule spans exactly `full`), seed `seed`, no checkpoints, ranked at its
    last validation. The winner's `dvc exp run` sets the same epochs, max_steps and seed
    (`exp_params`), so a trial at full budget and the pipeline's run learn the same."""
    epochs = max(train.epochs, math.ceil(full / steps_per_epoch(rows, train.global_batch_size)))
    return dataclasses.replace(train, epochs=epochs, max_steps=full, seed=seed,
                               checkpoint_every=0, select="last", early_stopping_patience=0,
                               profile_steps="")


def exp_params(recipe: dict, trained: TrainConfig) -> dict:
    """What `dvc exp run -S` sets for a recipe trained as `trained` (a `budgeted` config)."""
    return {**recipe, "train.epochs": trained.epochs, "train.max_steps": trained.max_steps,
            "train.seed": trained.seed}


def shown(recipe: dict) -> str:
    """`train.lr=3.1e-05, train.warmup_ratio=0.08`: a recipe in one line."""
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in sorted(recipe.items()))


def recipe_id(recipe: dict) -> str:
    """A short stable name for a recipe (its values, rounded to what a float prints)."""
    text = json.dumps({k: (float(f"{v:.6g}") if isinstance(v, float) else v)
                       for k, v in sorted(recipe.items())}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def search_id(search: SearchConfig, train: TrainConfig, model: ModelConfig,
              tokens_digest: str) -> str:
    """The search's name, `s-<hash>`: of the search section, the train and model sections it
    starts from, and the token files. The same inputs resume the same search; any change
    starts a new one (its trials would not be comparable)."""
    text = json.dumps([dataclasses.asdict(search), dataclasses.asdict(train),
                       dataclasses.asdict(model), tokens_digest], sort_keys=True, default=str)
    return "s-" + hashlib.sha256(text.encode()).hexdigest()[:10]


def recipe_of(config: dict) -> tuple[dict, int | None, str]:
    """(recipe, seed or None, phase) from a trial's Tune config: a search trial's config is the
    drawn recipe itself; a final-check trial's is {"proof": {"recipe": ..., "seed": ...}}."""
    if "proof" in config:
        return rounded(config["proof"]["recipe"]), int(config["proof"]["seed"]), "proof"
    return rounded(config), None, "search"


def config_key(config: dict) -> str:
    """A trial's config as what it trains (phase, rounded recipe, seed): a phase started afresh
    (a fixed grid, or Tune's state set aside) finds its finished trials by it, under new ids."""
    return "config:" + json.dumps(recipe_of(config), sort_keys=True)
