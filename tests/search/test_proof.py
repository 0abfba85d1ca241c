"""Finalists, and the verdict of the winner against the runner-up over seeds."""

from __future__ import annotations

import numpy as np

from wellfed.search import proof
from wellfed.search.trial import encode


def reports(step, value, metric="val/macro_f1"):
    return [{"step": step, metric: value}]


def test_ranked_puts_the_trials_that_went_further_first_then_the_better_figure():
    found = {"a": reports(16, 0.9), "b": reports(64, 0.7), "c": reports(64, 0.8),
             "d": reports(32, 0.95)}
    configs = {k: {"train.lr": i * 1e-4} for i, k in enumerate("abcd", 1)}
    order = [r["trial"] for r in proof.ranked(found, configs, "val/macro_f1", lower=False)]
    assert order == ["c", "b", "d", "a"]
    loss = {"a": reports(64, 0.3, "val/loss"), "b": reports(64, 0.2, "val/loss")}
    assert [r["trial"] for r in proof.ranked(loss, configs, "val/loss", lower=True)] == ["b", "a"]


def test_finalists_skip_a_recipe_proposed_twice():
    rows = [{"trial": "a", "recipe": {"train.lr": 1e-4}}, {"trial": "b", "recipe":
            {"train.lr": 1e-4}}, {"trial": "c", "recipe": {"train.lr": 3e-4}}]
    assert [r["trial"] for r in proof.finalists(rows, 2)] == ["a", "c"]
    assert proof.proof_configs(proof.finalists(rows, 2), [1, 2]) == [
        {"recipe": {"train.lr": 1e-4}, "seed": 1, "finalist": 0},
        {"recipe": {"train.lr": 1e-4}, "seed": 2, "finalist": 0},
        {"recipe": {"train.lr": 3e-4}, "seed": 1, "finalist": 1},
        {"recipe": {"train.lr": 3e-4}, "seed": 2, "finalist": 1}]


def final_group(finalist, seeds, right_share, gold, rng, lr):
    out = []
    for seed in seeds:
        predicted = np.where(rng.random(len(gold)) < right_share, gold, 1 - gold)
        right = (predicted == gold).mean()
        out.append({"trial": f"{finalist}-{seed}", "seed": seed, "recipe": {"train.lr": lr},
                    "val/accuracy": float(right), "predicted": encode(predicted)})
    return out


def test_a_clearly_better_recipe_beats_the_runner_up_over_seeds_and_rows():
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 800)
    finals = [final_group(0, [1, 2, 3], 0.70, gold, rng, 1e-5),
              final_group(1, [1, 2, 3], 0.90, gold, rng, 1e-4)]
    found = proof.verdict(finals, "val/accuracy", False, "single_label", ("0", "1"), gold,
                          np.arange(800), {})
    assert found["winner"] == {"train.lr": 1e-4}
    assert found["call"] == "beats" and found["interval_over"] == "seeds and rows"
    assert found["ci95"][0] > 0.1 and "beats the runner-up" in found["text"]


def test_two_equal_recipes_are_indistinguishable():
    rng = np.random.default_rng(1)
    gold = rng.integers(0, 2, 400)
    finals = [final_group(0, [1, 2, 3], 0.8, gold, rng, 1e-5),
              final_group(1, [1, 2, 3], 0.8, gold, rng, 1e-4)]
    found = proof.verdict(finals, "val/accuracy", False, "single_label", ("0", "1"), gold,
                          np.arange(400), {})
    assert found["call"] == "indistinguishable"
    assert found["ci95"][0] < 0 < found["ci95"][1]


def test_a_lower_is_better_metric_is_compared_over_seeds_alone():
    finals = [[{"trial": f"a{s}", "seed": s, "recipe": {"train.lr": 1e-5}, "val/loss": v}
               for s, v in zip((1, 2, 3), (0.50, 0.52, 0.51))],
              [{"trial": f"b{s}", "seed": s, "recipe": {"train.lr": 1e-4}, "val/loss": v}
               for s, v in zip((1, 2, 3), (0.30, 0.31, 0.29))]]
    found = proof.verdict(finals, "val/loss", True, "single_label", ("0", "1"),
                          np.zeros(3, int), np.arange(3), {})
    assert found["winner"] == {"train.lr": 1e-4}
    assert found["interval_over"] == "seeds only" and found["call"] == "beats"
    assert found["ci95"][1] < 0  # lower is better: the winner's loss minus the runner-up's
