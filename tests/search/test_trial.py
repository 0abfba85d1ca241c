"""A search trial is the ordinary loop: at full budget it learns what the pipeline's run of the
same recipe and seed learns, and a warm process leaks nothing from one trial to the next."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.conftest import random_token_files
from wellfed.config import DataConfig, ModelConfig, TrainConfig
from wellfed.search import space
from wellfed.search.trial import Setting, decode, train
from wellfed.train.step.loop import Place, TrainJob
from wellfed.train.step.loop import train as loop_train

BASE = TrainConfig(epochs=1, lr=2e-3, global_batch_size=16, micro_batch_size=16,
                   report_every=4, eval_every=0)


@pytest.fixture(scope="module")
def setting(tmp_path_factory, tiny_model_dir):
    tokens = random_token_files(tmp_path_factory.mktemp("tokens"), tiny_model_dir)
    model = ModelConfig(name=str(tiny_model_dir), init="random")
    return Setting(BASE, model, DataConfig(), str(tokens), str(tiny_model_dir), ("0", "1"), 0,
                   "single_label", 256, 24, (4, 8, 24), 1, False)


def run(setting, recipe, seed, phase="search"):
    sent = []
    train(recipe, seed, phase, setting, sent.append)
    return sent


def test_a_trial_reports_at_its_rungs_with_its_curve(setting):
    sent = run(setting, {"train.lr": 1e-3}, 3)
    assert [r["step"] for r in sent] == [4, 8, 24]
    assert [s for s, _, _ in sent[0]["records"]] == [1, 2, 3, 4]
    assert [s for s, _, _ in sent[-1]["records"]] == list(range(9, 25))
    assert {"val/loss", "val/macro_f1", "val/accuracy", "timing", "trial_s"} <= set(sent[-1])
    assert sent[-1]["timing"]["steps"] > 0 and "predicted" not in sent[-1]


def test_at_full_budget_a_trial_learns_what_the_pipelines_loop_learns(setting):
    sent = run(setting, {"train.lr": 1e-3, "train.warmup_ratio": 0.1}, 5)
    trained = space.budgeted(dataclasses.replace(BASE, lr=1e-3, warmup_ratio=0.1), 256, 24, 5)
    assert space.exp_params({}, trained) == {"train.epochs": 2, "train.max_steps": 24,
                                             "train.seed": 5}
    plain = dataclasses.replace(BASE, lr=1e-3, warmup_ratio=0.1, epochs=2, max_steps=24,
                                seed=5, eval_every=8)  # a pipeline run: its own eval_every
    reports = []
    job = TrainJob(plain, setting.data, setting.model, Path(setting.tokens_dir),
                   setting.model_source, setting.labels, setting.pad_id)
    loop_train(job, Place(torch.device("cpu")), lambda m, d: reports.append(m))
    final = [r["val"] for r in reports if r.get("val")][-1]
    assert final["val/loss"] == pytest.approx(sent[-1]["val/loss"], abs=1e-6)
    assert final["val/accuracy"] == sent[-1]["val/accuracy"]


def test_a_warm_process_gives_the_same_trial_twice_and_proof_trials_carry_predictions(setting):
    first = run(setting, {"train.lr": 2e-3}, 1, "proof")
    run(setting, {"train.lr": 5e-4}, 2)  # another trial in between
    again = run(setting, {"train.lr": 2e-3}, 1, "proof")
    assert [r["val/loss"] for r in first] == [r["val/loss"] for r in again]
    assert len(decode(first[-1]["predicted"])) == 32
    assert (decode(first[-1]["predicted"]) == decode(again[-1]["predicted"])).all()


def test_a_final_check_group_of_different_seeds_gives_each_run_what_it_gets_alone(setting):
    """search/fused.py's group task with finalists x seeds in one group: each member's reports
    (its curve, validation figures and predictions) are those of the same search trial alone."""
    from wellfed.search import fused

    members = [({"train.lr": 2e-3}, 1), ({"train.lr": 5e-4}, 2), ({"train.lr": 2e-3}, 2)]
    got = fused.train_group(setting, members, 1)
    assert got[0]["tokens"]["computed"] > got[0]["tokens"]["alone"]  # own batches: padding
    for (recipe, seed), result in zip(members, got):
        alone = run(setting, recipe, seed, "proof")
        fused_reports = result["reports"]
        assert [r["step"] for r in fused_reports] == [r["step"] for r in alone] == [4, 8, 24]
        for f, a in zip(fused_reports, alone):
            assert f["seed"] == a["seed"] == seed
            assert f["val/loss"] == pytest.approx(a["val/loss"], rel=1e-5)
            assert [x[1] for x in f["records"]] == pytest.approx([x[1] for x in a["records"]],
                                                                 rel=1e-5)
        assert (decode(fused_reports[-1]["predicted"]) == decode(alone[-1]["predicted"])).all()


def test_a_fused_groups_loading_bars_go_to_its_log_not_the_console(setting, tmp_path, capfd,
                                                                   tiny_model_dir):
    """transformers' `Loading weights` bar (stderr, a model with weights to load) stays off the
    console on the default path too: a group's output goes to trials/<its trials>.log, the
    sizing's to trials/sizing.log, as a trial's does with ASHA."""
    import shutil

    from wellfed.model import load_model
    from wellfed.search import fused

    saved = tmp_path / "pretrained"
    load_model(ModelConfig(init="random"), str(tiny_model_dir), ["0", "1"]).save_pretrained(saved)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(tiny_model_dir / name, saved / name)
    logs = tmp_path / "trials"
    loaded = dataclasses.replace(setting, model=ModelConfig(name=str(saved)),
                                 model_source=str(saved), log_dir=str(logs))
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()  # a test before may have turned the bar off
    hf_logging.enable_progress_bar()
    try:
        run_group_and_sizing(fused, loaded, tmp_path, capfd)
    finally:
        if not was:
            hf_logging.disable_progress_bar()
    assert sorted(p.name for p in logs.iterdir()) == ["s_00000+s_00001.log", "sizing.log"]
    assert all("Loading weights" in p.read_text() for p in logs.iterdir())


def run_group_and_sizing(fused, loaded, tmp_path, capfd) -> None:
    capfd.readouterr()
    members = [("s_00000", None, {"train.lr": 1e-3}, 1), ("s_00001", None, {"train.lr": 2e-3}, 1)]

    class Task:  # stands for ray.remote(train_group): runs it here
        def remote(self, *args):
            return fused.train_group(*args)

    got = fused.submit(Task(), members, loaded, 1, tmp_path)
    assert [r["step"] for r in got[1]["reports"]] == [4, 8, 24]
    assert fused.size(loaded, 2, 1).trials >= 1
    out = capfd.readouterr()
    assert "Loading weights" not in out.err + out.out, out.err[-500:]
