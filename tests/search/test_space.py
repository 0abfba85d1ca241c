"""From a drawn recipe to the sections a trial trains with, and back to `dvc exp run -S`."""

from __future__ import annotations

import numpy as np

from wellfed.config import ModelConfig, SearchConfig, TrainConfig
from wellfed.search import space


def test_a_drawn_recipe_is_rounded_to_what_params_yaml_will_say():
    recipe = space.rounded({"train.lr": np.float64(3.08234891e-05), "train.global_batch_size":
                            np.int64(32), "train.class_weights": "balanced"})
    assert recipe == {"train.lr": 3.082e-05, "train.global_batch_size": 32,
                      "train.class_weights": "balanced"}
    assert type(recipe["train.global_batch_size"]) is int


def test_applied_gives_each_key_its_sections_type():
    train, model = space.applied({"train.lr": 3e-5, "train.global_batch_size": 64.0,
                                  "model.lora_r": 8.0}, TrainConfig(), ModelConfig())
    assert (train.lr, train.global_batch_size, model.lora_r) == (3e-5, 64, 8)
    assert type(train.global_batch_size) is int and type(model.lora_r) is int


def test_budgeted_holds_the_full_budget_in_enough_epochs_and_exp_params_repeat_it():
    # 600 rows at batch 16 = 38 steps an epoch: 100 steps need 3 epochs
    trained = space.budgeted(TrainConfig(epochs=1, global_batch_size=16, micro_batch_size=16,
                                         checkpoint_every=100, select="best"), 600, 100, 7)
    assert (trained.epochs, trained.max_steps, trained.seed) == (3, 100, 7)
    assert (trained.checkpoint_every, trained.select, trained.early_stopping_patience) == \
        (0, "last", 0)
    assert space.exp_params({"train.lr": 3e-5}, trained) == {
        "train.lr": 3e-5, "train.epochs": 3, "train.max_steps": 100, "train.seed": 7}


def test_the_search_id_follows_its_inputs():
    base = space.search_id(SearchConfig(), TrainConfig(), ModelConfig(), "tokens-a")
    assert base == space.search_id(SearchConfig(), TrainConfig(), ModelConfig(), "tokens-a")
    changed = {space.search_id(SearchConfig(trials=8), TrainConfig(), ModelConfig(), "tokens-a"),
               space.search_id(SearchConfig(), TrainConfig(lr=3e-5), ModelConfig(), "tokens-a"),
               space.search_id(SearchConfig(), TrainConfig(), ModelConfig(), "tokens-b")}
    assert len(changed) == 3 and base not in changed and base.startswith("s-")


def test_the_optuna_space_has_every_dimension():
    import optuna.distributions as od

    dims = SearchConfig(space={"train": {"lr": "log_uniform 1e-5 1e-3", "weight_decay":
                                         "choice 0.0 0.1", "global_batch_size": "int 8 32"}}
                        ).dimensions()
    found = space.optuna_space(dims)
    assert found["train.lr"] == od.FloatDistribution(1e-5, 1e-3, log=True)
    assert found["train.weight_decay"] == od.CategoricalDistribution([0.0, 0.1])
    assert found["train.global_batch_size"] == od.IntDistribution(8, 32)
