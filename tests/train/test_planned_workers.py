"""The planned step under several workers, on this CPU: the loop's own `train` at world 2 (two
processes, torch.distributed over gloo, the shape plan run eagerly as `train.cuda_graphs: true`
runs it on a CPU, gradients all-reduced from the flat buffers, no DDP) learns what one worker
learns from the same global batches: the same per-step losses over 30 steps and the same
final weights, to fp32 rounding. The CUDA side (the all-reduce captured in the update graph,
NCCL) is tests/gpu/test_cuda_graphs_nccl.py.

9-19 s on this 2-core machine as its load varied (two fresh processes import torch and
transformers): under the slow tier's ~20 s, so it runs in the fast tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.conftest import random_token_files
from tests.train.test_gradients import run_ranks

STEPS = 30


def job_for(tokens: Path, model_dir: Path):
    from wellfed.config import DataConfig, ModelConfig, TrainConfig
    from wellfed.train.step.loop import TrainJob

    # 256 train rows, batch 32: 8 steps an epoch, 4 epochs planned, 30 taken. No validation
    # or checkpoint before the last step; warmup and decay so the learning rate moves.
    train = TrainConfig(epochs=4, max_steps=STEPS, lr=1e-3, warmup_ratio=0.1,
                        global_batch_size=32, micro_batch_size=16, precision="fp32", seed=3,
                        eval_every=0, checkpoint_every=0, report_every=10, max_shapes=4,
                        cuda_graphs="true")
    return TrainJob(train=train, data=DataConfig(), model=ModelConfig(init="random"),
                    tokens_dir=tokens, model_source=str(model_dir), labels=("a", "b"), pad_id=0)


def run_loop(rank: int, world: int, tokens: str, model_dir: str, out: str) -> None:
    """One copy of the loop (what every Ray worker runs), writing its per-step losses, the
    step path it took and the final checkpoint's weights to `out`.rank."""
    from wellfed.train.step.loop import Place, train

    tokens, model_dir = Path(tokens), Path(model_dir)
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank,
                                world_size=world)
    seen = {}

    def report(metrics: dict, directory: Path | None) -> None:
        seen["path"] = metrics["derived"]["step_path"]
        if directory is not None:
            seen["weights"] = torch.load(directory / "model.pt")

    def no_ddp(model):  # train/step/loop.py must not wrap the planned path
        raise AssertionError("the planned path was wrapped in DDP")

    try:
        state = train(job_for(tokens, model_dir), Place(torch.device("cpu"), rank, world),
                      report, wrap=no_ddp)
    finally:
        if world > 1:
            dist.destroy_process_group()
    torch.save({"losses": [r["loss"] for r in state.history], "path": seen["path"],
                "weights": seen.get("weights")}, f"{out}.{rank}")


@pytest.fixture(scope="module")
def dropout_free(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny BERT without dropout: ranks draw other masks than one worker would."""
    import shutil

    folder = tmp_path_factory.mktemp("no-dropout")
    shutil.copytree(tiny_model_dir, folder, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.integration
def test_two_gloo_workers_learn_what_one_worker_learns(tmp_path, dropout_free):
    (tmp_path / "tokens").mkdir()
    tokens = random_token_files(tmp_path / "tokens", dropout_free)
    threads = torch.get_num_threads()
    try:
        run_loop(0, 1, str(tokens), str(dropout_free), str(tmp_path / "one"))
    finally:
        torch.set_num_threads(threads)
    run_ranks(run_loop, 2, 2, str(tokens), str(dropout_free), str(tmp_path / "two"))
    one = torch.load(tmp_path / "one.0")
    two = [torch.load(tmp_path / f"two.{r}") for r in range(2)]
    assert one["path"] == two[0]["path"] == two[1]["path"] == "planned_eager"
    assert len(one["losses"]) == len(two[0]["losses"]) == STEPS
    assert two[0]["losses"] == two[1]["losses"]  # the loop's loss is the mean over ranks
    assert one["losses"][-1] < one["losses"][0]  # it learns something to compare
    assert two[0]["losses"] == pytest.approx(one["losses"], rel=1e-5, abs=1e-6)
    assert two[1]["weights"] is None  # rank 0 writes the checkpoint
    assert one["weights"].keys() == two[0]["weights"].keys() and len(one["weights"]) > 10
    for key, value in one["weights"].items():
        torch.testing.assert_close(two[0]["weights"][key], value, rtol=1e-4, atol=1e-6)
