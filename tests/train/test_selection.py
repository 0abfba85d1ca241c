"""Best checkpoint and early stopping, in-process with the tiny model: a planted validation curve
(the loop's `evaluate_split` replaced by a script), checkpoints persisted and pruned by wellfed's
store (train/checkpoints/store.py) as both engines prune them, then chosen by the driver and
exported."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import random_token_files
from wellfed.config import DataConfig, ModelConfig, TrainConfig, load_section
from wellfed.train.checkpoints import checkpoint, retention
from wellfed.train.checkpoints.state import Best
from wellfed.train.checkpoints.store import Store
from wellfed.train.outputs import export, reports
from wellfed.train.run import driver, placement, ray_train
from wellfed.train.step import loop, selection
from wellfed.train.step.loop import Place, TrainJob, train

CPU = Place(torch.device("cpu"))


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_model_dir) -> TrainJob:
    """16 steps per epoch (256 rows / 16), validated every 4 steps, no periodic checkpoints:
    every checkpoint but the last is there because its validation was a new best."""
    tokens = random_token_files(tmp_path_factory.mktemp("tokens"), tiny_model_dir)
    cfg = TrainConfig(epochs=1, lr=3e-3, global_batch_size=16, micro_batch_size=16, eval_every=4,
                      report_every=4, checkpoint_every=0, precision="fp32", seed=0,
                      warmup_ratio=0.0)
    return TrainJob(train=cfg, data=DataConfig(), model=ModelConfig(init="random"),
                    tokens_dir=tokens, model_source=str(tiny_model_dir), labels=("neg", "pos"),
                    pad_id=0)


def with_train(job: TrainJob, **changes) -> TrainJob:
    return dataclasses.replace(job, train=dataclasses.replace(job.train, **changes))


def plant(monkeypatch, curve: list[float], key: str = "val/macro_f1") -> list[int]:
    """Validation returns `curve` in order (for `key`; the other figures fixed); returns the
    list of steps it was called at, filled as training runs."""
    figures, calls = iter(curve), []

    def evaluate_split(s, data, rank, pad_id, k, keep_logits=False):
        calls.append(s.scheduler.last_epoch)  # one scheduler step per optimizer step
        return {"val/loss": 0.5, "val/accuracy": 0.5, "val/macro_f1": 0.5,
                key: next(figures)}, None

    monkeypatch.setattr(loop, "evaluate_split", evaluate_split)
    return calls


class Storage:
    """A report sink that persists checkpoints as both engines do: into wellfed's store, in a
    launch folder of its own (one per sink: a new process), pruned to `keep` newest plus the
    best (train.keep_checkpoints; the tests' 1 is what Ray's CheckpointConfig used to keep).
    Also keeps every checkpoint's weights by step, whatever the store keeps."""

    def __init__(self, root: Path, select: str, keep: int | None = 1):
        self.store, self.select, self.keep, self.weights = Store(str(root), "run"), select, keep, {}
        self.launch = self.store.open_launch("in_process")

    def __call__(self, metrics: dict, directory: Path | None) -> None:
        if directory is None:
            return
        step = metrics["records"][-1]["step"]
        self.weights[step] = torch.load(directory / checkpoint.MODEL, weights_only=True)
        path = self.store.commit(directory, self.launch, step, metrics.get(selection.RANK_KEY, 0))
        self.store.register(path)  # the driver has its report
        retention.prune(self.store, self.keep, best=self.select == "best")

    def kept(self) -> list[int]:
        return [entry.step for entry in self.store.entries()]


def run(job: TrainJob, sink, **kwargs) -> dict:
    return train(job, CPU, sink, **kwargs)


def exported_weights(model_dir: Path) -> dict:
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(model_dir).state_dict()


def same(a: dict, b: dict) -> bool:
    assert len(a) > 10 and a.keys() == b.keys()
    return all(torch.equal(a[k], b[k]) for k in a)


def test_best_is_checkpointed_kept_by_ray_and_exported(job, tmp_path, monkeypatch, capsys):
    evals = plant(monkeypatch, [0.5, 0.8, 0.6, 0.7])
    sink = Storage(tmp_path, "best")
    state = run(job, sink)
    assert evals == [4, 8, 12, 16] and state.step == 16
    assert sorted(sink.weights) == [4, 8, 16]  # new bests at 4 and 8, and the final step
    assert state.best == Best("val/macro_f1", step=8, value=0.8, rank=2, since=2)
    assert sink.kept() == [8, 16]  # the store pruned step 4: the best and the latest stay
    trained = driver.choose(sink.store, job)
    assert (trained.chosen.step, trained.last.step) == (8, 16)
    assert sink.store.state(trained.chosen).step == 8
    for entry in sink.store.entries():  # the weights once: model.pt, never also hf_model/
        assert not (Path(entry.path) / checkpoint.HF_MODEL).exists()
    history, _ = export.weights(trained, job.tokens_dir, tmp_path / "model", "", "")
    assert [h["step"] for h in history] == list(range(1, 17))  # the whole run's, not step 8's
    weights = exported_weights(tmp_path / "model")
    assert same(weights, sink.weights[8]) and not same(weights, sink.weights[16])
    assert (tmp_path / "model" / "tokenizer.json").is_file()
    # The DVC metrics' val/* are the exported step-8 model's; the last validation (step 16)
    # stays beside them as val_last/* (before: val/macro_f1 0.7 beside a model that scored 0.8).
    summary = reports.summarize(history, 1.0, SimpleNamespace(
        real_tokens_per_s=1, padding_efficiency=1, input_wait_share=0, mfu=0),
        trained.best, trained.chosen.step)
    assert summary["train/best_step"] == 8 and summary["val/macro_f1"] == 0.8
    assert summary["val_last/macro_f1"] == 0.7
    assert sorted(k for k in summary if k.startswith("val")) == [
        "val/accuracy", "val/loss", "val/macro_f1", "val_last/accuracy", "val_last/loss",
        "val_last/macro_f1"]


def test_select_last_exports_the_final_step_as_before(job, tmp_path, monkeypatch):
    plant(monkeypatch, [0.5, 0.8, 0.6, 0.7])
    last = with_train(job, select="last")
    sink = Storage(tmp_path, "last")
    state = run(last, sink)
    assert sorted(sink.weights) == [16] and state.best.step == 8  # still recorded
    trained = driver.choose(sink.store, last)
    assert trained.chosen == trained.last
    history, _ = export.weights(trained, job.tokens_dir, tmp_path / "model", "", "")
    assert same(exported_weights(tmp_path / "model"), sink.weights[16])
    summary = reports.summarize(history, 1.0, SimpleNamespace(
        real_tokens_per_s=1, padding_efficiency=1, input_wait_share=0, mfu=0),
        trained.best, trained.chosen.step)  # the last is the model: no val_last/*
    assert summary["val/macro_f1"] == 0.7 and not any(k.startswith("val_last/") for k in summary)


def test_val_loss_selects_the_minimum(job, tmp_path, monkeypatch):
    plant(monkeypatch, [0.9, 0.7, 0.8, 0.75], key="val/loss")
    by_loss = with_train(job, select_metric="val/loss")
    sink = Storage(tmp_path, "best")
    state = run(by_loss, sink)
    assert (state.best.metric, state.best.step, state.best.value) == ("val/loss", 8, 0.7)
    assert driver.choose(sink.store, by_loss).chosen.step == 8


def test_early_stop_after_patience_flat_validations(job, tmp_path, monkeypatch, capsys):
    # Validations at 4, 8, 12, 16, ...: a tie (12) is no improvement; 2 in a row stop the run.
    plant(monkeypatch, [0.5, 0.6, 0.6, 0.55, 0.9])
    patient = with_train(job, epochs=3, early_stopping_patience=2)
    sink = Storage(tmp_path, "best")
    state = run(patient, sink)
    assert state.step == 16 and [h["step"] for h in state.history] == list(range(1, 17))
    assert sorted(sink.weights) == [4, 8, 16] and sink.kept() == [8, 16]
    out = capsys.readouterr().out
    assert ("[wellfed] early stop at step 16: val/macro_f1 has not improved on 0.6000 (step 8) "
            "for 2 validations") in out.splitlines()
    trained = driver.choose(sink.store, patient)
    assert (trained.chosen.step, trained.last.step) == (8, 16)
    # A resume of the early-stopped run (a signal raced the stop) trains no further.
    again = run(patient, lambda metrics, directory: pytest.fail("reported"),
                resume=Path(trained.last.path))
    assert again.step == 16


def test_a_resume_keeps_the_best_so_far(job, tmp_path, monkeypatch):
    plant(monkeypatch, [0.5, 0.8, 0.6, 0.7, 0.65, 0.75, 0.7, 0.72])
    longer = with_train(job, epochs=2)  # 32 steps, validations every 4
    first = Storage(tmp_path, "best")
    stops = iter([False] * 11 + [True])  # preempted after step 12: it validates first
    state = run(longer, first, stop=lambda: next(stops))
    assert state.step == 12 and state.best.step == 8 and first.kept() == [8, 12]
    second = Storage(tmp_path, "best")  # a new process: a launch of its own, the same store
    start, damage = second.store.recover()
    assert (start.step, damage) == (12, None)
    resumed = run(longer, second, resume=Path(start.path))
    assert resumed.step == 32
    assert (resumed.best.step, resumed.best.value, resumed.best.rank) == (8, 0.8, 2)
    assert second.kept() == [8, 32]  # across both launches
    trained = driver.choose(second.store, longer)
    assert trained.chosen.step == 8 and trained.chosen.launch == first.launch
    export.weights(trained, job.tokens_dir, tmp_path / "model", "", "")
    assert same(exported_weights(tmp_path / "model"), first.weights[8])


def test_select_metric_must_be_a_figure_of_the_task():
    with pytest.raises(ValueError) as err:
        selection.resolve("val/accuracy", "regression")
    assert str(err.value) == ("train.select_metric 'val/accuracy' is not a validation figure of "
                              "this regression task (data/tokens/meta.json); use auto "
                              "(val/pearson) or one of val/loss, val/mse, val/pearson")
    assert selection.resolve("auto", "single_label") == "val/macro_f1"
    assert selection.resolve("auto", "multi_label") == "val/macro_f1"
    assert selection.resolve("val/subset_accuracy", "multi_label") == "val/subset_accuracy"
    with pytest.raises(ValueError, match=r"^invalid params: train.select_metric must be auto or "
                                         r"a validation figure like val/macro_f1 or val/loss; "
                                         r"got 'macro_f1'$"):
        load_section({"train": {"select_metric": "macro_f1"}}, "train")
    with pytest.raises(ValueError, match="train.early_stopping_patience needs periodic "
                                         "validations; set train.eval_every > 0"):
        load_section({"train": {"early_stopping_patience": 3, "eval_every": 0}}, "train")
    with pytest.raises(ValueError, match="train.select must be one of"):
        load_section({"train": {"select": "first"}}, "train")


def test_fit_refuses_a_wrong_select_metric_before_ray_starts(job, tmp_path, monkeypatch):
    from wellfed.config import RayConfig

    monkeypatch.setattr(driver, "local_token_auth", lambda cfg: None)  # no env side effect
    monkeypatch.setattr(ray_train, "connect", lambda cfg: pytest.fail("Ray was started"))
    monkeypatch.setattr(placement, "connect", lambda cfg: pytest.fail("Ray was started"))
    monkeypatch.setattr(driver, "open_run", lambda *a: pytest.fail("training began"))  # in-process
    with pytest.raises(ValueError, match="not a validation figure of this single_label task"):
        driver.fit(tokens_dir=job.tokens_dir, model_source=job.model_source, labels=["a", "b"],
                   pad_id=0, task="single_label", model_cfg=job.model,
                   train_cfg=dataclasses.replace(job.train, select_metric="val/pearson"),
                   data_cfg=job.data, ray_cfg=RayConfig(), storage=tmp_path, uri="",
                   experiment="x", params={}, tags={})


def test_improvement_is_strict_and_never_non_finite():
    best = selection.fresh("val/loss")
    assert not selection.observe(best, {"val/loss": float("nan")}, 2)
    assert selection.observe(best, {"val/loss": 0.5}, 4) and best.rank == 1
    assert not selection.observe(best, {"val/loss": 0.5}, 6)  # a tie keeps the earlier step
    assert not selection.observe(best, {"val/loss": float("-inf")}, 8)
    assert best == Best("val/loss", step=4, value=0.5, rank=1, since=2)


@pytest.mark.integration
def test_the_chosen_step_is_printed_and_logged_to_mlflow(job, tmp_path, capsys):
    import mlflow

    from wellfed.track import tracking
    from wellfed.train.checkpoints.store import Entry

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "best", "r")
    best = Best("val/macro_f1", step=40, value=0.8123, rank=3, since=2)
    at_40, at_96 = (Entry(f"{tmp_path}/01-in_process/checkpoint_{s:06d}", "01-in_process", s)
                    for s in (40, 96))
    store = Store(str(tmp_path), "run")
    driver.announce(driver.Trained(at_40, at_96, best, job, store), uri, run_id)
    logged = mlflow.MlflowClient(uri).get_run(run_id).data.metrics
    assert logged == {"best/val/macro_f1": 0.8123}  # its step: the stage's train/best_step
    assert capsys.readouterr().out == ("[wellfed] model: step 40 of 96, the best val/macro_f1 "
                                       "0.8123 (train.select: best)\n")
    last = with_train(job, select="last")
    driver.announce(driver.Trained(at_96, at_96, best, last, store), uri, run_id)
    assert capsys.readouterr().out == ("[wellfed] model: step 96 of 96, the last (train.select: "
                                       "last); the best was val/macro_f1 0.8123 at step 40\n")
