"""The graphed step with a process group (what every Ray Train worker has): NCCL at world 1 on
one GPU. The update graph captures the flat gradient buffer's all-reduce (train/step/gradients.py)
with clipping and AdamW; the run learns what the single-worker graphed step learns, with no
host sync once captured, and a capture failure still falls back to the same learning.

World 1 is what one lent GPU can run: the collective is captured and replayed, but NCCL moves
nothing between GPUs. Several GPUs have not run this (docs/gpu.md). The math at world 2 is
tests/train/test_planned_workers.py (gloo, CPU).

Skipped without a CUDA device: `python -m pytest tests/gpu -m cuda` on a GPU box.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

from tests.gpu.test_cuda_graphs import (CUDA, assert_no_host_sync, assert_same_learning, run,
                                        run_with_a_failing_capture)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@contextlib.contextmanager
def one_rank(folder):
    """A one-rank NCCL process group, gone afterwards."""
    dist.init_process_group("nccl", init_method=f"file://{folder / 'store'}", rank=0,
                            world_size=1, device_id=CUDA)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def nccl(tmp_path):
    with one_rank(tmp_path) as group:
        yield group


@pytest.mark.parametrize("dropout", [False, True])
def test_the_all_reduce_is_captured_and_learns_as_one_worker(tiny_model_dir, token_file,
                                                             dropout, tmp_path):
    alone = run(tiny_model_dir, token_file, dropout=dropout)  # no group: the one-worker step
    assert not alone[0].graphs.flat.shared and alone[0].graphs.update is not None
    with one_rank(tmp_path) as group:
        grouped = run(tiny_model_dir, token_file, dropout=dropout)
    g = grouped[0].graphs
    assert g.flat.shared and g.flat.group is group and not g.failed
    assert g.update is not None and len(g.micro) >= 2 and g.replays > g.eager
    assert_same_learning(grouped, alone, 1e-3, 1e-3)


def test_no_host_sync_once_captured_with_the_all_reduce(tiny_model_dir, token_file, nccl):
    s, _, _ = run(tiny_model_dir, token_file, steps=400, until_captured=True)
    assert s.graphs.flat.shared and s.graphs.update is not None
    assert_no_host_sync(s, token_file)


def test_a_capture_failure_with_a_group_updates_eagerly_and_learns_the_same(
        tiny_model_dir, token_file, monkeypatch, capsys, nccl):
    """The update's capture is agreed over the group (one all-reduce MIN, here of one rank);
    after a failed capture the run goes on with the same learning, its update and all-reduce
    eager, or replayed where the update was captured before the failure."""
    fallen = run_with_a_failing_capture(tiny_model_dir, token_file, monkeypatch, False)
    g = fallen[0].graphs
    assert g.failed and not g.micro and g.flat.shared
    assert "CUDA graph capture failed" in capsys.readouterr().out
    eager = run(tiny_model_dir, token_file, capture=False, dropout=False)
    assert_same_learning(fallen, eager, 1e-3, 1e-3)
