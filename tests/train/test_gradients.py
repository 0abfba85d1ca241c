"""The planned step's flat gradient buffers (train/step/gradients.py): every trainable gradient is a
view into them and stays one through backward, zeroing, AdamW and a planned step; the
all-reduce gives each rank the mean of the ranks' gradients (two gloo processes on this CPU);
the update's capture is kept only where every rank made one (graphs.update); setup refuses a
DDP model or a world size the process group does not have."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.train.test_graphs import planned_setup, task_file
from wellfed.config import TrainConfig
from wellfed.telemetry.meter import StepMeter
from wellfed.telemetry.peak import Peak
from wellfed.train.step import gradients
from wellfed.train.step.feeding import feed
from wellfed.train.step.setup import planned_group, setup
from wellfed.train.step.step import train_step

CPU = torch.device("cpu")


def two_kinds() -> torch.nn.Module:
    """Three layers: an fp32 one, a frozen one and a float64 one (two buffers)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 3),
                                torch.nn.Linear(3, 2).double())
    model[1].requires_grad_(False)
    return model


def forward(model, x):
    return model[2](model[1](model[0](x)).double()).sum()


def test_every_trainable_gradient_is_a_view_of_a_flat_buffer():
    model = two_kinds()
    model[0].bias.grad = torch.full((3,), 7.0)  # a gradient held before binding is kept
    flat = gradients.bind(model)
    assert not flat.shared and flat.world == 1
    assert [b.dtype for b in flat.buffers] == [torch.float32, torch.float64]
    assert [b.numel() for b in flat.buffers] == [4 * 3 + 3, 3 * 2 + 2]
    assert len(flat.views) == 4 and model[1].weight.grad is None  # the frozen layer has none
    assert gradients.bound(flat, model)
    assert torch.equal(model[0].bias.grad, torch.full((3,), 7.0))
    fp32 = next(b for b in flat.buffers if b.dtype == torch.float32)
    assert model[0].weight.grad.data_ptr() == fp32.data_ptr()  # the buffer's storage itself


def test_backward_adds_into_the_buffers_and_zeroing_keeps_them():
    model = two_kinds()
    flat = gradients.bind(model)
    x = torch.randn(5, 4)
    forward(model, x).backward()
    once = [b.clone() for b in flat.buffers]
    assert all(b.abs().sum() > 0 for b in once)
    forward(model, x).backward()  # accumulates in place: twice the gradient
    for b, first in zip(flat.buffers, once):
        torch.testing.assert_close(b, 2 * first)
    model.zero_grad(set_to_none=False)
    assert gradients.bound(flat, model) and all(not b.any() for b in flat.buffers)
    model.zero_grad(set_to_none=True)  # what the planned path never does: cut loose
    assert not gradients.bound(flat, model)


def test_a_planned_run_keeps_its_gradients_bound(tmp_path, tiny_model_dir):
    """Fused AdamW, clipping, GradScaler's calls and zeroing in place over 6 planned steps."""
    data = task_file(tmp_path / "t.arrow", "single_label", rows=300)
    s = planned_setup(tiny_model_dir, data, "single_label", cuda_graphs="true")
    flat = s.graphs.flat
    assert flat is not None and not flat.shared and gradients.bound(flat, s.model)
    meter = StepMeter(CPU, Peak(1e12, "test"), s.model.config)
    before = torch.cat([b.clone() for b in flat.buffers])
    for step, batches in itertools.islice(feed(s, data, tmp_path / "t.arrow", 0, epochs=3), 6):
        train_step(s, step, batches, meter, data.lengths)
    assert gradients.bound(flat, s.model) and s.graphs.updates == 6
    assert not torch.cat(flat.buffers).any() and not before.any()  # zeroed after each update


def test_setup_refuses_a_ddp_model_and_a_world_without_its_group(tmp_path, tiny_model_dir):
    data = task_file(tmp_path / "t.arrow", "single_label", rows=60)
    cfg = TrainConfig(global_batch_size=16, micro_batch_size=8, precision="fp32",
                      cuda_graphs="true", max_shapes=2)
    model = planned_setup(tiny_model_dir, data, "single_label", cuda_graphs="false").model
    with pytest.raises(ValueError, match="process group has 1 rank"):
        setup(cfg, model, len(data), CPU, world=2, lengths=data.lengths)
    ddp = torch.nn.parallel.DistributedDataParallel.__new__(
        torch.nn.parallel.DistributedDataParallel)  # the type is what is refused
    with pytest.raises(TypeError, match="without DistributedDataParallel"):
        planned_group(ddp, 1)


def run_ranks(target, world: int, *args, timeout: float = 300) -> None:
    """`target(rank, *args)` in `world` fresh Python processes at once (subprocesses, not
    multiprocessing: its resource tracker would stay behind as a child of the test process,
    where tests/train/test_loop.py counts the loader processes); raises with a failed rank's
    stderr tail."""
    code = (f"import json, sys; from {target.__module__} import {target.__name__} as f; "
            "f(int(sys.argv[1]), *json.loads(sys.argv[2]))")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(rank), json.dumps(args)],
                              cwd=root, env=env, stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    errors = []
    for rank, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        if proc.returncode:
            errors.append(f"rank {rank} exited {proc.returncode}: {err[-2000:]}")
    assert not errors, "\n".join(errors)


def reduce_at_world_two(rank: int, store: str, out: str) -> None:
    """One of two gloo ranks: bind (rank 0's weights broadcast), a backward on this rank's own
    input, the all-reduce, and two agreements; writes what it saw to `out`.rank."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model = two_kinds()
        if rank == 1:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)  # rank 1 starts elsewhere: bind takes rank 0's weights
        flat = gradients.bind(model, dist.group.WORLD)
        weights = [p.detach().clone() for p in model.parameters()]
        torch.manual_seed(100 + rank)
        forward(model, torch.randn(5, 4)).backward()
        own = [b.clone() for b in flat.buffers]
        gradients.all_reduce(flat)
        torch.save({"weights": weights, "own": own, "reduced": [b.clone() for b in flat.buffers],
                    "bound": gradients.bound(flat, model), "shared": flat.shared,
                    "all_yes": gradients.agree(flat, True),
                    "one_no": gradients.agree(flat, rank == 0),
                    "kept": [captured_update(model, flat, rank, made, capturing) is not None
                             for made, capturing in (((0, 1), (0, 1)), ((0,), (0, 1)),
                                                     ((0, 1), (0,)))]}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def captured_update(model, flat, rank: int, made: tuple[int, ...],
                    capturing: tuple[int, ...]):
    """graphs.update at its capture step, with graphs.captured planted: ranks in `made` return a
    graph, the others fail; ranks not in `capturing` had a capture fail before (g.capture off),
    and then no rank may try. Returns the update graph this rank kept."""
    from types import SimpleNamespace

    from wellfed.train.step import graphs

    class Graph:  # what a capture returns; a replay runs the update eagerly here
        def __init__(self, work):
            self.work = work

        def replay(self):
            self.work()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    zero = {name: torch.zeros(()) for name in ("loss", "scale", "norm")}
    g = graphs.Graphs(capture=rank in capturing, full_mask=False, flat=flat, updates=1, **zero)
    s = SimpleNamespace(graphs=g, device=CPU, optimizer=optimizer,
                        scaler=torch.amp.GradScaler("cpu", enabled=False),
                        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0))
    meter = SimpleNamespace(computing=contextlib.nullcontext)

    def eager_update(s_, set_to_none):
        s_.optimizer.step()
        return torch.ones(()), 0.0

    def planted(g_, work):
        assert len(capturing) == 2, "a capture tried while another rank had stopped capturing"
        return Graph(work) if rank in made else None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graphs, "captured", planted)
        graphs.update(s, meter, eager_update)
    return g.update


@pytest.mark.integration
def test_the_all_reduce_gives_every_rank_the_mean_gradient(tmp_path):
    run_ranks(reduce_at_world_two, 2, str(tmp_path / "store"), str(tmp_path / "seen"))
    seen = [torch.load(tmp_path / f"seen.{r}") for r in range(2)]
    for a, b in zip(seen[0]["weights"], seen[1]["weights"]):
        assert torch.equal(a, b)  # rank 0's weights on both
    assert len(seen[0]["reduced"]) == 2
    for i in range(2):
        mean = (seen[0]["own"][i] + seen[1]["own"][i]) / 2
        assert not torch.equal(seen[0]["own"][i], seen[1]["own"][i])  # different inputs
        for r in range(2):
            torch.testing.assert_close(seen[r]["reduced"][i], mean)
    for r in range(2):
        assert seen[r]["bound"] and seen[r]["shared"]
        assert seen[r]["all_yes"] is True and seen[r]["one_no"] is False
        # both captured: both keep the update graph; only rank 0 did: neither keeps it; rank
        # 1 had stopped capturing: neither tries
        assert seen[r]["kept"] == [True, False, False]


def test_one_rank_agrees_with_itself():
    flat = gradients.bind(two_kinds())
    assert gradients.agree(flat, True) is True and gradients.agree(flat, False) is False
    before = [b.clone() for b in flat.buffers]
    gradients.all_reduce(flat)  # no group: nothing to do
    assert all(torch.equal(a, b) for a, b in zip(before, flat.buffers))
