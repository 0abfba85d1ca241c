"""`loop.train` in-process on one CPU device, no Ray: it learns, reports, validates, checkpoints
in the named layout, and a resume from a checkpoint goes on with the next step."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from wellfed.config import DataConfig, ModelConfig, TrainConfig
from wellfed.data.token_files import TokenBatch, write_token_file
from wellfed.train.checkpoints import checkpoint
from wellfed.train.step.loop import Place, TrainJob, train

CPU = Place(torch.device("cpu"))


def token_file(path: Path, rows: int, seed: int) -> None:
    """Label 1 iff token 2000 occurs in the row: learnable by a tiny model in a few dozen steps."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, rows)
    seqs = []
    for label in labels:
        seq = rng.integers(1000, 1999, size=rng.integers(4, 20))
        if label:
            seq[rng.integers(0, len(seq))] = 2000
        seqs.append(seq.astype(np.int32))
    write_token_file(path, [TokenBatch(np.concatenate(seqs), np.array([len(s) for s in seqs], np.int32),
                                       labels, np.arange(rows))])


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_model_dir) -> TrainJob:
    tokens = tmp_path_factory.mktemp("tokens")
    token_file(tokens / "train.arrow", 256, 0)
    token_file(tokens / "validation.arrow", 64, 1)
    cfg = TrainConfig(epochs=3, lr=3e-3, global_batch_size=16, micro_batch_size=8, eval_every=16,
                      report_every=4, checkpoint_every=8, precision="fp32", seed=0, warmup_ratio=0.0)
    return TrainJob(train=cfg, data=DataConfig(), model=ModelConfig(init="random"),
                    tokens_dir=tokens, model_source=str(tiny_model_dir), labels=("neg", "pos"),
                    pad_id=0)


class Collect:
    """A report sink: keeps every worker report and a copy of every checkpoint by step."""

    def __init__(self, out: Path):
        self.out, self.reports, self.checkpoints = out, [], {}

    def __call__(self, metrics: dict, directory: Path | None) -> None:
        self.reports.append(metrics)
        if directory:
            step = metrics["records"][-1]["step"]
            self.checkpoints[step] = shutil.copytree(directory, self.out / f"step_{step}")


def steps_of(reports: list[dict]) -> list[int]:
    return [r["step"] for rep in reports for r in rep["records"]]


def test_train_runs_in_process_learns_and_checkpoints(job, tmp_path):
    sink = Collect(tmp_path)
    state = train(job, CPU, sink)
    assert state.step == 48 and len(state.history) == 48  # 3 epochs x 256 / 16
    assert len(sink.reports) == 12 and steps_of(sink.reports) == list(range(1, 49))
    losses = [h["loss"] for h in state.history]
    assert np.mean(losses[-8:]) < 0.7 * np.mean(losses[:8])
    vals = [rep["val"] for rep in sink.reports if "val" in rep]
    assert len(vals) == 3 and vals[-1]["val/accuracy"] > 0.7
    assert sorted(sink.checkpoints) == [8, 16, 24, 32, 40, 48]
    # Each report carries the loop's time so far, in parts that only grow (telemetry/phases.py).
    timings = [rep["timing"] for rep in sink.reports]
    assert set(timings[-1]) == {"setup", "steps", "validation", "checkpoints", "reports"}
    assert all(later["steps"] > earlier["steps"] for earlier, later in zip(timings, timings[1:]))
    final = sink.checkpoints[48]
    for name in (checkpoint.MODEL, checkpoint.OPTIM, checkpoint.STATE):
        assert (sink.checkpoints[40] / name).exists(), name
    # The last step's checkpoint trains no further step: no optimizer state (2x the weights).
    assert (final / checkpoint.MODEL).exists() and not (final / checkpoint.OPTIM).exists()
    for step in (24, 48):  # the weights once: model.pt, no Hugging Face copy beside it
        assert not (sink.checkpoints[step] / checkpoint.HF_MODEL).exists()
    assert checkpoint.read_state(final).step == 48


def test_a_resumed_run_goes_on_with_the_next_step(job, tmp_path):
    first = Collect(tmp_path / "a")
    (tmp_path / "a").mkdir()
    stops = iter([False] * 19 + [True])  # a preemption after step 20: checkpoint there, stop
    state = train(job, CPU, first, stop=lambda: next(stops))
    assert state.step == 20 and max(first.checkpoints) == 20
    second = Collect(tmp_path / "b")
    (tmp_path / "b").mkdir()
    state = train(job, CPU, second, resume=first.checkpoints[20])
    assert steps_of(second.reports) == list(range(21, 49))
    assert [h["step"] for h in state.history] == list(range(1, 49))  # each step once


def test_a_resume_from_the_final_checkpoint_trains_nothing_and_keeps_its_state(job, tmp_path):
    first = Collect(tmp_path / "a")
    (tmp_path / "a").mkdir()
    done = train(job, CPU, first)
    again = Collect(tmp_path / "b")
    (tmp_path / "b").mkdir()
    state = train(job, CPU, again, resume=first.checkpoints[48])
    assert again.reports == [] and state.step == 48 and state.history == done.history


def test_a_profile_window_writes_a_trace_into_the_final_checkpoint(job, tmp_path):
    import dataclasses

    short = dataclasses.replace(job, train=dataclasses.replace(job.train, epochs=1,
                                                               profile_steps="3-4"))
    sink = Collect(tmp_path)
    train(short, CPU, sink)
    profile = sink.checkpoints[16] / checkpoint.PROFILE
    assert (profile / "trace_steps_3-4.json").is_file()
    assert "Self CPU" in (profile / "top_operators.txt").read_text()


def test_the_planned_step_trains_validates_and_resumes_through_the_loop(job, tmp_path, capsys):
    """train.cuda_graphs true on a CPU: the shape plan's step, eagerly, through the whole loop
    (validation on the plan's shapes, checkpoints with the learning rate on the device, a
    resume that puts it back there), learning as the dynamic step does."""
    import dataclasses

    planned = dataclasses.replace(job, train=dataclasses.replace(job.train, cuda_graphs="true",
                                                                 max_shapes=4))
    first = Collect(tmp_path / "a")
    (tmp_path / "a").mkdir()
    stops = iter([False] * 23 + [True])
    state = train(planned, CPU, first, stop=lambda: next(stops))
    assert state.step == 24
    out = capsys.readouterr().out
    assert "[wellfed] step: planned_eager (cuda_graphs true on a CPU" in out and "4 shapes" in out
    assert first.reports[0]["derived"]["step_path"] == "planned_eager"
    assert first.reports[0]["eager_micro_batches"] > 0 and first.reports[0]["graph_replays"] == 0
    second = Collect(tmp_path / "b")
    (tmp_path / "b").mkdir()
    state = train(planned, CPU, second, resume=first.checkpoints[24])
    assert steps_of(second.reports) == list(range(25, 49))
    lrs = [h["lr"] for h in state.history]
    assert all(isinstance(lr, float) for lr in lrs) and lrs[-1] < lrs[0]
    losses = [h["loss"] for h in state.history]
    assert np.mean(losses[-8:]) < 0.7 * np.mean(losses[:8])
    vals = [rep["val"] for rep in first.reports + second.reports if "val" in rep]
    # 64 validation rows under dropout: 0.66-0.70 over seeds on either path (plan or not)
    assert len(vals) == 3 and vals[-1]["val/accuracy"] > 0.6
