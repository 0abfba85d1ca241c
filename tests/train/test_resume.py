"""A stop is not a fork: a run stopped at several steps and resumed each time is the run it would
have been, the same per-step losses to every digit, the same validations and the same final
weights, with dropout on (the tiny BERT's 0.1), so a lost or reseeded random state shows.

In-process (one worker: the dynamic step, the planned step, loader processes) and at world 2
(two gloo processes running the loop as every Ray Train worker runs it: DDP, each rank's own
dropout generator saved by rank 0 and handed back to its rank). The GPU's graphed path is the
device check tests/gpu/test_cuda_resume.py. The loader-process case and world 2 are in the slow
tier (`make test`): 100 and 66 s under this 2-core machine's load of the day, beside 84-137 s
for the other two (and 118-239 s for each of test_train.py's).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import random_token_files
from tests.train.test_gradients import run_ranks
from wellfed.config import DataConfig, ModelConfig, TrainConfig
from wellfed.train.checkpoints import checkpoint
from wellfed.train.step.loop import Place, TrainJob, train

STOPS = (6, 8, 13)
"""Where the stopped run stops: inside epoch 0 on a step that validates, on the epoch's last step,
and inside epoch 1."""
STEPS = 16


def job_for(tokens: Path, model_dir: Path, **changes) -> TrainJob:
    # 256 rows, batch 32: 8 steps an epoch, 2 epochs. A validation at 6 and 12 (eval mode: it
    # draws no random number, and a stopped run must agree on that too).
    cfg = TrainConfig(epochs=2, lr=3e-3, global_batch_size=32, micro_batch_size=16,
                      eval_every=6, report_every=4, checkpoint_every=0, precision="fp32",
                      seed=5, warmup_ratio=0.1, max_shapes=4)
    data = DataConfig(loader_workers=changes.pop("loader_workers", 0))
    return TrainJob(train=dataclasses.replace(cfg, **changes), data=data,
                    model=ModelConfig(init="random"), tokens_dir=tokens,
                    model_source=str(model_dir), labels=("neg", "pos"), pad_id=0)


class Keep:
    """A report sink that keeps the last checkpoint (copied) and its weights."""

    def __init__(self, out: Path):
        self.out, self.last = out, None

    def __call__(self, metrics: dict, directory: Path | None) -> None:
        if directory is not None:
            step = metrics["records"][-1]["step"]
            self.last = shutil.copytree(directory, self.out / f"step_{step}")


def stop_at(start: int, until: int):
    """A stop check answering yes after step `until` (the loop asks once after each step but the
    last; a run resumed at `start` first asks after step start + 1)."""
    asked = itertools.count(start + 1)
    return lambda: next(asked) == until


def stopped_and_resumed(job: TrainJob, place: Place, out: Path, stops=STOPS, wrap=None,
                        sink_type=Keep):
    """The run stopped after each of `stops` and resumed from the checkpoint the stop wrote
    (rank 0 writes it into `out`, shared by the ranks as Ray's storage is); returns the final
    state and the last checkpoint (None on the other ranks)."""
    resume, start, state = None, 0, None
    for i, until in enumerate([*stops, None]):
        sink = sink_type(out / f"part{i}")
        kwargs = {"wrap": wrap} if wrap else {}
        state = train(job, place, sink, resume=resume,
                      stop=stop_at(start, until) if until else None, **kwargs)
        assert state.step == (until or STEPS)
        if place.world > 1:  # every rank resumes from rank 0's copy, once it is written
            torch.distributed.barrier()
        resume, start = out / f"part{i}" / f"step_{state.step}", state.step
    return state, resume if place.rank == 0 else None


def figures(state) -> list[dict]:
    """Every step's record but its timing-free figures: loss, grad norm, lr, validation."""
    return [{k: v for k, v in h.items() if k == "loss" or k == "grad_norm" or k == "lr"
             or k.startswith("val/")} for h in state.history]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, tiny_model_dir) -> Path:
    return random_token_files(tmp_path_factory.mktemp("tokens"), tiny_model_dir)


@pytest.mark.parametrize("changes", [
    pytest.param({}, id="dynamic"), pytest.param({"cuda_graphs": "true"}, id="planned"),
    pytest.param({"loader_workers": 1}, marks=pytest.mark.slow, id="loader-process")])
def test_a_run_stopped_three_times_is_the_uninterrupted_run(tokens, tiny_model_dir, tmp_path,
                                                            changes):
    """Before the generators were kept, a resume reseeded dropout with seed + 7919 x step: the
    losses differed from the step after the first stop on (0.6780 vs 0.6772 at step 4)."""
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["hidden_dropout_prob"] > 0  # else there is no random state to lose
    job = job_for(tokens, tiny_model_dir, **changes)
    cpu = Place(torch.device("cpu"))
    whole = Keep(tmp_path / "whole")
    straight = train(job, cpu, whole)
    state, last = stopped_and_resumed(job, cpu, tmp_path)
    assert len(straight.history) == len(state.history) == STEPS
    assert [h["step"] for h in state.history] == list(range(1, STEPS + 1))
    assert sum("val/loss" in h for h in state.history) == 3  # steps 6, 12 and the last
    # Every digit: a float compared with ==, not approx.
    assert [h["loss"] for h in state.history] == [h["loss"] for h in straight.history]
    assert figures(state) == figures(straight)
    mine, theirs = checkpoint.weights(last), checkpoint.weights(whole.last)
    assert len(mine) > 10 and all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_a_stop_on_a_validation_step_keeps_that_validation_and_early_stopping(tokens,
                                                                              tiny_model_dir,
                                                                              tmp_path):
    """A stop that lands on a step due to validate validates first: before, the stopped run
    skipped step 6's validation for good and, with patience, early-stopped 2 steps later than
    the uninterrupted run (at 6 instead of 4 here, validating every 2 steps)."""
    job = job_for(tokens, tiny_model_dir, eval_every=2, early_stopping_patience=1, lr=3e-1)
    cpu = Place(torch.device("cpu"))
    straight = train(job, cpu, Keep(tmp_path / "whole"))
    assert straight.step < STEPS  # the patience ran out: the case this test is about
    first = Keep(tmp_path / "part0")
    stop = straight.step - 2  # a validation step, before the one that stops the run early
    assert train(job, cpu, first, stop=stop_at(0, stop)).step == stop
    state = train(job, cpu, Keep(tmp_path / "part1"), resume=first.last)
    assert state.step == straight.step
    assert figures(state) == figures(straight)


def run_world_two(rank: int, tokens: str, model_dir: str, out: str) -> None:
    """One of two gloo ranks (what each Ray Train worker runs: the loop, DDP-wrapped): the
    uninterrupted run, then the run stopped at STOPS and resumed; writes both histories and
    final weights to `out`.rank."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=2)
    try:
        job = job_for(Path(tokens), Path(model_dir))
        place = Place(torch.device("cpu"), rank, 2)
        ddp = torch.nn.parallel.DistributedDataParallel
        whole = Keep(Path(f"{out}.whole.{rank}"))
        straight = train(job, place, whole, wrap=ddp)
        state, last = stopped_and_resumed(job, place, Path(f"{out}.parts"), wrap=ddp)
    finally:
        dist.destroy_process_group()
    torch.save({"straight": figures(straight), "resumed": figures(state),
                "weights": [checkpoint.weights(p) if p else None for p in (whole.last, last)]},
               f"{out}.{rank}")


@pytest.mark.slow  # two fresh processes importing torch and transformers, 5 runs each
def test_two_workers_stopped_three_times_are_the_uninterrupted_run(tokens, tiny_model_dir,
                                                                    tmp_path):
    run_ranks(run_world_two, 2, str(tokens), str(tiny_model_dir), str(tmp_path / "two"))
    ranks = [torch.load(tmp_path / f"two.{r}", weights_only=False) for r in range(2)]  # ours
    for seen in ranks:
        assert len(seen["straight"]) == STEPS
        assert seen["resumed"] == seen["straight"]
    assert ranks[0]["straight"] == ranks[1]["straight"]  # the loss is the mean over ranks
    assert ranks[1]["weights"] == [None, None]  # rank 0 writes the checkpoints
    mine, theirs = ranks[0]["weights"][1], ranks[0]["weights"][0]
    assert len(mine) > 10 and all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_a_resume_that_cannot_put_every_rank_back_reseeds_and_says_why():
    """Another worker count (a lost node shrank the run), or a checkpoint from before the
    generators were kept: each rank is seeded from (seed, step, rank) and rank 0 says so."""
    from wellfed.train.checkpoints import random_state

    cpu = torch.device("cpu")
    two = [random_state.capture(cpu), random_state.capture(cpu)]
    assert random_state.restore(two, cpu, 0, 1, 5, 80) == "the checkpoint's 2 worker(s) are 1 now"
    reseeded = torch.rand(3)
    torch.manual_seed(5 + 7919 * 80)
    assert torch.equal(reseeded, torch.rand(3))
    assert random_state.restore(None, cpu, 0, 1, 5, 80) == "the checkpoint keeps no random state"
    assert random_state.restore(two[:1], torch.device("cuda", 0), 0, 1, 5, 80) == \
        "the checkpoint was made on a CPU"
    assert random_state.reseeded_line("the checkpoint keeps no random state", 80) == (
        "[wellfed] resuming at step 80 with dropout reseeded (the checkpoint keeps no random "
        "state): the steps from here draw other masks than the uninterrupted run would have")
    # Put back, every generator draws on as it would have.
    import random

    import numpy as np

    saved = random_state.capture(cpu)
    ahead = (torch.rand(2).tolist(), random.random(), np.random.random())
    random.random(), np.random.random(), torch.rand(5)  # moved on, as the run after the stop
    assert random_state.restore([saved], cpu, 0, 1, 5, 80) is None
    assert (torch.rand(2).tolist(), random.random(), np.random.random()) == ahead
