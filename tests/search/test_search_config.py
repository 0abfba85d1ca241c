"""The `search` section: every distribution parsed, every bad value said in one line naming its
key and the fix, before any trial (the check stage loads it with the rest of params.yaml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from wellfed.config import SearchConfig, load_params, load_section
from wellfed.config.search import Dimension, parse

PROJECT = Path(__file__).resolve().parents[2]


def problems(**values) -> str:
    with pytest.raises(ValueError) as err:
        load_section({"search": values}, "search")
    return str(err.value)


def test_every_kind_of_distribution_parses_with_its_bounds():
    cfg = load_section({"search": {"space": {"train": {
        "lr": "log_uniform 1e-5 3e-4", "warmup_ratio": "uniform 0 0.2",
        "global_batch_size": "int 16 64", "weight_decay": "choice 0.0 0.01 0.1",
        "class_weights": "choice none balanced"}, "model": {"lora_r": "choice 0 8 16"}}}},
        "search")
    dims = {d.key: d for d in cfg.dimensions()}
    assert len(dims) == 6
    assert dims["train.lr"] == Dimension("train.lr", "log_uniform", 1e-5, 3e-4)
    assert dims["train.warmup_ratio"] == Dimension("train.warmup_ratio", "uniform", 0.0, 0.2)
    assert dims["train.global_batch_size"] == Dimension("train.global_batch_size", "int", 16, 64)
    assert dims["train.weight_decay"].choices == (0.0, 0.01, 0.1)
    assert dims["train.class_weights"].choices == ("none", "balanced")
    assert dims["model.lora_r"].choices == (0, 8, 16)
    assert dims["train.lr"].text() == "log_uniform 1e-05 0.0003"


@pytest.mark.parametrize("space, said", [
    ({"train": {"lrr": "uniform 0 1"}}, "unknown key 'train.lrr' (did you mean 'train.lr'?)"),
    ({"train": {"seed": "int 1 9"}}, "search.space.train.seed cannot be searched: seeds are"),
    ({"train": {"max_steps": "int 1 9"}}, "search.space.train.max_steps cannot be searched"),
    ({"model": {"name": "choice a b"}}, "run one search per model"),
    ({"train": {"lr": "log_uniform 3e-4 1e-5"}}, "the range 0.0003..1e-05 is empty"),
    ({"train": {"lr": "log_uniform 0 1e-3"}}, "log_uniform needs bounds above 0"),
    ({"train": {"lr": "normal 0 1"}}, "must be one of log_uniform, uniform, int, choice"),
    ({"train": {"lr": "uniform 1e-5"}}, "uniform takes two numbers, LOW HIGH"),
    ({"train": {"lr": "int 1 5"}}, "int is for whole-number keys"),
    ({"train": {"global_batch_size": "uniform 8 64"}}, "use 'choice ...' or 'int LOW HIGH'"),
    ({"train": {"weight_decay": "choice 0.1 0.1"}}, "at least two different values"),
    ({"train": {"lr": "uniform -1 1"}}, "search.space.train.lr can draw -1.0, which train "
                                         "refuses: train.lr must be in (0, 1)"),
    ({"train": {"precision": "choice fp32 fp8"}}, "can draw 'fp8', which train refuses"),
    ({"data": {"prefetch": "int 1 4"}}, "search.space.data: a search draws keys of the train "
                                        "and model sections"),
])
def test_a_bad_space_is_one_line_naming_the_key_and_the_fix(space, said):
    text = problems(space=space)
    assert said in text, text
    assert "\n" not in text


@pytest.mark.parametrize("values, said", [
    ({"min_steps": 16, "max_steps": 40}, "search.max_steps 40 leaves ASHA no rung to stop a "
                                         "trial at (it needs at least search.min_steps x "
                                         "search.reduction_factor = 48)"),
    ({"reduction_factor": 1}, "search.reduction_factor must be >= 2"),
    ({"seeds": [1, 1, 2]}, "search.seeds must be a list of different whole numbers"),
    ({"seeds": [7]}, "search.seeds lists 1 seed: telling two recipes apart over seeds needs"),
    ({"finalists": 5, "trials": 3}, "search.finalists 5 is more than search.trials 3"),
    ({"trials": 0}, "search.trials must be >= 1"),
    ({"metric": "accuracy"}, "search.metric must be auto or a validation figure like val/loss"),
    ({"trails": 4}, "unknown key 'search.trails' (did you mean 'search.trials'?)"),
])
def test_a_bad_budget_is_one_line(values, said):
    text = problems(**values)
    assert said in text, text


def test_all_problems_are_said_at_once():
    text = problems(trials=0, reduction_factor=1, space={"train": {"lrr": "uniform 0 1"}})
    assert text.count(";") >= 2 and "search.trials" in text and "reduction_factor" in text \
        and "train.lrr" in text


def test_the_projects_params_search_is_valid_and_searches_the_recipe():
    (cfg,) = load_params(PROJECT / "params.yaml", "search")
    assert isinstance(cfg, SearchConfig)
    assert [d.key for d in cfg.dimensions()] == ["train.lr", "train.warmup_ratio",
                                                 "train.weight_decay"]


def test_the_check_stage_refuses_a_bad_search_param_before_any_stage(tmp_path):
    params = yaml.safe_load((PROJECT / "params.yaml").read_text())
    params["search"]["space"]["train"]["lr"] = "log_uniform 1e-3 1e-5"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run([sys.executable, str(PROJECT / "stages" / "check.py"),
                           str(tmp_path / "params.yaml")], capture_output=True, text=True)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "search.space.train.lr: the range 0.001..1e-05 is empty" in lines[0]


def test_parse_reads_a_choice_as_yaml_would():
    dim, problem = parse("train.class_weights", "choice none balanced", str)
    assert problem is None and dim.choices == ("none", "balanced")
    dim, _ = parse("train.compile", "choice true false", bool)
    assert dim.choices == (True, False)
