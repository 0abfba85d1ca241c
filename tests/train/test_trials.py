"""Fused trials (train/trials/) against the same trials trained alone, on this CPU in float32:
the same per-step losses and validation figures for single-label, multi-label, regression and
sentence pairs, with dropout on; after a halving the survivors go on as they would alone; what
cannot be fused is refused in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from wellfed.config import DataConfig, ModelConfig, TrainConfig
from wellfed.data.token_files import TokenBatch, write_token_file
from wellfed.train.step.loop import Place, TrainJob, train
from wellfed.train.trials import group as trial_group
from wellfed.train.trials.layers import TrialModel, refusal

CPU = Place(torch.device("cpu"))
CLASSES = 3
RTOL = 1e-5  # float32: batched matmuls and per-trial norms sum in another order than alone
BASE = TrainConfig(epochs=2, max_steps=6, global_batch_size=8, micro_batch_size=4,
                   precision="fp32", seed=5, eval_every=0, report_every=1,
                   checkpoint_every=0, warmup_ratio=0.1)
RECIPES = [dict(lr=3e-3, weight_decay=0.0, warmup_ratio=0.0),
           dict(lr=1e-3, weight_decay=0.1, warmup_ratio=0.25, max_grad_norm=0.05),
           dict(lr=5e-4, weight_decay=0.01, warmup_ratio=0.1)]


def token_dir(root, task: str, pairs: bool = False):
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", 40), ("validation", 12)):
        lens = rng.integers(3, 14, rows).astype(np.int32)
        labels = {"single_label": rng.integers(0, CLASSES, rows),
                  "multi_label": (rng.random((rows, CLASSES)) < 0.4).astype(np.float32),
                  "regression": rng.normal(size=(rows, CLASSES)).astype(np.float32)}[task]
        segments = (lens // 2).astype(np.int32) if pairs else None
        write_token_file(root / f"{split}.arrow", [TokenBatch(
            rng.integers(1000, 3000, lens.sum()).astype(np.int32), lens, labels,
            np.arange(rows), segments)])
    return root


def job_for(tokens, model_dir, task: str, **train) -> TrainJob:
    return TrainJob(train=dataclasses.replace(BASE, **train), data=DataConfig(),
                    model=ModelConfig(init="random"), tokens_dir=tokens,
                    model_source=str(model_dir), labels=tuple(f"c{i}" for i in range(CLASSES)),
                    pad_id=0, task=task)


def alone(job: TrainJob, validate_at=frozenset()) -> tuple[list[float], dict[int, dict]]:
    """The trial as the search trains it alone: the ordinary loop, no checkpoints."""
    records = []
    train(job, CPU, lambda metrics, _ckpt: records.append(metrics),
          validate_at=frozenset(validate_at), checkpoints=False)
    steps = [r for m in records for r in m["records"]]
    vals = {m["records"][-1]["step"]: m["val"] for m in records if m.get("val")}
    return [r["loss"] for r in steps], vals


def close(a: float, b: float) -> bool:
    return abs(a - b) <= RTOL * max(abs(a), abs(b)) + 1e-6


def assert_same(fused_losses, alone_losses, what: str):
    assert len(fused_losses) == len(alone_losses), what
    bad = [(i + 1, f, a) for i, (f, a) in enumerate(zip(fused_losses, alone_losses))
           if not close(f, a)]
    assert not bad, f"{what}: steps (step, fused, alone) differ: {bad[:3]}"


def each_as_alone(job, configs, run) -> None:
    """Each trial of the group `run` has the losses and validation figures (at 3 and 6) of the
    same trial trained alone."""
    for k, cfg in enumerate(configs):
        losses, vals = alone(dataclasses.replace(job, train=cfg), {3})
        assert_same([r["loss"] for r in run.history[k]], losses, f"trial {k} (seed {cfg.seed})")
        fused_vals = {v["step"]: v for v in run.validations[k]}
        assert sorted(fused_vals) == sorted(vals) == [3, 6]
        for step, figures in vals.items():
            for key, value in figures.items():
                assert close(fused_vals[step][key], value), (k, step, key)


@pytest.mark.parametrize("task,pairs", [("single_label", False), ("multi_label", False),
                                        ("regression", False), ("single_label", True)],
                         ids=["single_label", "multi_label", "regression", "pairs"])
def test_a_fused_trial_learns_what_it_learns_alone(tmp_path, tiny_model_dir, task, pairs):
    tokens = token_dir(tmp_path / "tokens", task, pairs)
    configs = [dataclasses.replace(BASE, **r) for r in RECIPES]
    job = job_for(tokens, tiny_model_dir, task)
    run = trial_group.train_group(job, configs, CPU, validate_at=frozenset({3}))
    each_as_alone(job, configs, run)
    # the recipes differ, so the trials do: the group is not one trial K times
    assert len({round(run.history[k][-1]["loss"], 6) for k in range(3)}) == 3


def test_after_a_halving_the_survivors_go_on_as_alone(tmp_path, tiny_model_dir):
    tokens = token_dir(tmp_path / "tokens", "single_label")
    configs = [dataclasses.replace(BASE, **r) for r in RECIPES]
    job = job_for(tokens, tiny_model_dir, "single_label")
    asked = []

    def decide(step, figures):
        asked.append((step, sorted(figures)))
        return [2, 0]  # keep two, in another order than they came

    run = trial_group.train_group(job, configs, CPU, validate_at=frozenset({3}), decide=decide)
    assert asked == [(3, [0, 1, 2])]
    assert run.steps == {0: 6, 1: 3, 2: 6}
    assert [len(run.history[k]) for k in range(3)] == [6, 3, 6]
    for k in (0, 2):
        losses, _ = alone(dataclasses.replace(job, train=configs[k]), {3})
        assert_same([r["loss"] for r in run.history[k]], losses, f"survivor {k}")


class Stopped(Exception):
    pass


def stopped_and_resumed(job, configs, rungs: frozenset, stop_at: int, saved):
    """The group trained whole, and trained again stopped at rung `stop_at` (its state saved
    to `saved`) then started again; at the first rung it keeps trials 2 and 0."""
    def decide(stop=None):
        def at(step, figures):
            if step == stop:
                raise Stopped
            return [2, 0] if step == min(rungs) else sorted(figures)
        return at

    whole = trial_group.train_group(job, configs, CPU, validate_at=rungs, decide=decide())
    with pytest.raises(Stopped):
        trial_group.train_group(job, configs, CPU, validate_at=rungs, decide=decide(stop_at),
                                saved=saved)
    again = trial_group.train_group(job, configs, CPU, validate_at=rungs, decide=decide(),
                                    saved=saved)
    return whole, again


def test_a_group_stopped_after_a_rung_goes_on_from_it_as_if_never_stopped(tmp_path,
                                                                            tiny_model_dir):
    """The state saved at a rung (trials/resume.py) across an epoch's end (5 steps an epoch):
    stopped at the third rung, the group started again goes on from the second (step 5, the
    next epoch's first batch) with the same losses, figures and halvings, to every digit."""
    tokens = token_dir(tmp_path / "tokens", "single_label")
    configs = [dataclasses.replace(BASE, max_steps=8, **r) for r in RECIPES]
    job = job_for(tokens, tiny_model_dir, "single_label", max_steps=8)
    rungs = frozenset({2, 5, 7})
    saved = tmp_path / "group.pt"
    whole, again = stopped_and_resumed(job, configs, rungs, 7, saved)
    assert (whole.resumed_at, again.resumed_at) == (0, 5)
    assert again.steps == whole.steps == {0: 8, 1: 2, 2: 8}
    for k in range(3):
        assert [r["step"] for r in again.history[k]] == [r["step"] for r in whole.history[k]]
        assert_same([r["loss"] for r in again.history[k]],
                    [r["loss"] for r in whole.history[k]], f"trial {k} resumed")
        assert again.validations[k] == whole.validations[k]
    # a state written for another group is not this one's: it starts afresh
    other = trial_group.train_group(job, configs[:2], CPU, validate_at=rungs, saved=saved)
    assert other.resumed_at == 0


def test_trials_of_two_groups_go_on_from_their_slices_as_one_group_as_alone(tmp_path,
                                                                           tiny_model_dir):
    """Halving across a whole search (search/rounds.py): each group stops at a rung and keeps
    each trial's own slice of its state; trials from different groups then go on as one
    group, in another order, and learn what each learns alone, to every step."""
    tokens = token_dir(tmp_path / "tokens", "single_label")
    configs = [dataclasses.replace(BASE, **r) for r in RECIPES]
    job = job_for(tokens, tiny_model_dir, "single_label")
    at = {k: tmp_path / f"t{k}@3.pt" for k in range(3)}
    first = trial_group.train_group(job, configs[:2], CPU, stop_at=3,
                                    slices={0: at[0], 1: at[1]})
    second = trial_group.train_group(job, configs[2:], CPU, stop_at=3, slices={0: at[2]})
    assert first.steps == {0: 3, 1: 3} and second.steps == {0: 3}
    assert [v["step"] for v in first.validations[1]] == [3]
    on = trial_group.train_group(job, [configs[2], configs[0]], CPU, start=[at[2], at[0]])
    assert on.resumed_at == 3 and on.steps == {0: 6, 1: 6}
    for pos, (k, before) in enumerate([(2, second.history[0]), (0, first.history[0])]):
        losses, vals = alone(dataclasses.replace(job, train=configs[k]), {3})
        assert_same([r["loss"] for r in before + on.history[pos]], losses, f"trial {k}")
        assert [r["step"] for r in on.history[pos]] == [4, 5, 6]
        for key, value in vals[6].items():
            assert close(on.validations[pos][-1][key], value), (k, key)
    # a slice holds one trial's weights, not a view of the group's K
    one = torch.load(at[0], weights_only=True)  # plain values: a checkpoint's load reads it
    name = one["stacked"][0]
    weight = one["weights"][name]
    assert weight.shape[0] == 1
    assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()
    with pytest.raises(ValueError, match="only trials at one step"):
        from wellfed.train.trials import resume

        later = tmp_path / "t2@6.pt"
        trial_group.train_group(job, [configs[2]], CPU, start=[at[2]], stop_at=5,
                                slices={0: later})
        resume.merged([at[0], later])


class Planted:
    """A pickle that runs a command when loaded without weights_only."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_group_state_planted_in_the_search_folder_runs_nothing(tmp_path, capfd):
    """Before, a group's state was read with a full unpickling (it held numpy values): a file
    planted as groups/<id>.pt ran its command when the search went on from it."""
    from wellfed.train.trials import resume

    marker, planted = tmp_path / "ran", tmp_path / "group.pt"
    torch.save({"version": resume.VERSION, "trials": 2, "code": Planted(marker)}, planted)
    assert resume.load(planted, 2) is None  # the group starts afresh
    assert not marker.exists() and not planted.exists()
    assert (tmp_path / "group.pt.unreadable").is_file()
    line = capfd.readouterr().out.strip()  # the process's own stdout, past a trial's log
    assert line == (f"[wellfed] {planted} is not a group state this search wrote (it names "
                    "posix.system, which a group's state never holds): set aside as "
                    "group.pt.unreadable; the group starts again from step 0")
    torch.save({"code": Planted(marker)}, planted)
    with pytest.raises(ValueError, match="is not a group state this search wrote") as err:
        resume.merged([planted])
    assert not marker.exists() and "\n" not in str(err.value)
    # a state a search stopped before the upgrade wrote (numpy's values in it) still reads
    torch.save({"version": 1, "trials": 2, "alive": [0, 1], "out": {
        "validations": {0: [{"val/loss": np.float64(0.5)}]},
        "logits": {0: np.zeros((3, 2), np.float32)}}}, planted)
    old = resume.load(planted, 2)
    assert old["out"]["validations"][0][0]["val/loss"] == 0.5
    assert np.asarray(old["out"]["logits"][0]).shape == (3, 2)


def test_the_check_can_fail_a_trial_with_another_data_order(tmp_path, tiny_model_dir):
    """The negative control: alone with another seed, the same recipe is not 'equal'."""
    tokens = token_dir(tmp_path / "tokens", "single_label")
    job = job_for(tokens, tiny_model_dir, "single_label")
    run = trial_group.train_group(job, [dataclasses.replace(BASE, **RECIPES[0])] * 3, CPU)
    losses, _ = alone(dataclasses.replace(job, train=dataclasses.replace(
        BASE, **RECIPES[0], seed=6)))
    with pytest.raises(AssertionError, match="differ"):
        assert_same([r["loss"] for r in run.history[0]], losses, "other seed")


def test_a_group_that_cannot_be_fused_is_refused_in_one_line(tiny_model_dir):
    other_batch = [BASE, dataclasses.replace(BASE, global_batch_size=16)]
    why = trial_group.refusal(other_batch)
    assert "train.global_batch_size=16" in why and "\n" not in why
    # seeds may differ: each trial then brings its own batches (test_trials_apart.py)
    assert trial_group.refusal([BASE, dataclasses.replace(BASE, seed=1)]) is None
    assert "fp16" in trial_group.refusal([dataclasses.replace(BASE, precision="fp16")] * 2)
    lora = trial_group.refusal([BASE, BASE], [ModelConfig(lora_r=8), ModelConfig(lora_r=8)])
    assert "LoRA" in lora
    assert "model.lora_r" in trial_group.refusal([BASE, BASE], [ModelConfig(),
                                                                ModelConfig(lora_r=8)])
    assert trial_group.refusal([BASE, dataclasses.replace(BASE, lr=1.0)]) is None


def test_a_model_with_a_weight_module_it_does_not_know_is_refused():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = torch.nn.Parameter(torch.ones(4))

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Scaled())
    assert "Scaled" in refusal(model) and "\n" not in refusal(model)
    tied = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    tied[1].weight = tied[0].weight
    assert "tied" in refusal(tied)
    with pytest.raises(ValueError, match="Scaled"):
        TrialModel(model, 2)


def test_k_follows_a_gpus_free_memory_and_a_cpus_measured_step(monkeypatch):
    from wellfed.train.trials import sizing

    gib = 2 ** 30
    assert sizing.by_memory(16, 20 * gib, 2 * gib).trials == 8  # 85% of 20 GiB holds 8
    assert sizing.by_memory(4, 20 * gib, 2 * gib).trials == 4   # no more than wanted
    assert sizing.by_memory(16, gib, 2 * gib).trials == 1       # not even two: one at a time
    assert "8 trial(s) of 2.00 GiB fit in 17.0 GiB" in sizing.by_memory(16, 20 * gib, 2 * gib).reason
    assert sizing.by_throughput(16, 1.0, 2.0, 4).trials == 4    # 4 fused in half their time
    slow = sizing.by_throughput(16, 1.0, 3.9, 4)
    assert slow.trials == 1 and "0.97x" in slow.reason and "one at a time" in slow.reason

    # A fake 24 GiB device with 10 GiB free, a trial measured at 3 GiB: 2 fit (8.5 GiB usable)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * gib, 24 * gib))
    monkeypatch.setattr(sizing, "probe_batch", lambda *a: {})
    monkeypatch.setattr(sizing, "trial_bytes", lambda model, batch: 3 * gib)
    choice = sizing.choose(None, 16, 32, 64, 0, torch.device("cuda", 0))
    assert choice.trials == 2 and "GPU's free 10.0 GiB" in choice.reason
