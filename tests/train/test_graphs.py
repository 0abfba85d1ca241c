"""The planned step on CPU (train/step/graphs.py without the capture, which needs a GPU: tests/gpu):
filler rows carry no loss and no gradient for every task, the shape plan learns exactly what the
dynamic step learns, train.cuda_graphs picks the path it says, and an out-of-memory halving
starts the shapes afresh."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from wellfed.config import ModelConfig, TrainConfig, load_section
from wellfed.data.batching import BatchSpec, collate
from wellfed.data.token_files import TokenBatch, TokenFile, write_token_file
from wellfed.model import load_model
from wellfed.telemetry.meter import StepMeter
from wellfed.telemetry.peak import Peak
from wellfed.train.step import graphs
from wellfed.train.step.feeding import feed
from wellfed.train.step.setup import setup
from wellfed.train.step.step import train_step
from wellfed.train.step.validation import evaluate_split

CPU = torch.device("cpu")
K = 3  # labels or targets of the multi-label and regression files


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: a second spinning thread only slows it here
    yield
    torch.set_num_threads(before)


def task_file(path, task: str, rows: int = 120, seed: int = 0) -> TokenFile:
    rng = np.random.default_rng(seed)
    lens = rng.integers(2, 30, rows).astype(np.int32)
    labels = {"single_label": rng.integers(0, K, rows),
              "multi_label": (rng.random((rows, K)) < 0.4).astype(np.float32),
              "regression": rng.normal(size=(rows, K)).astype(np.float32)}[task]
    write_token_file(path, [TokenBatch(rng.integers(1000, 3000, lens.sum()).astype(np.int32),
                                       lens, labels, np.arange(rows))])
    return TokenFile(path)


def planned_setup(model_dir, data: TokenFile, task: str, **train):
    torch.manual_seed(0)
    model = load_model(ModelConfig(init="random"), str(model_dir), [f"l{i}" for i in range(K)],
                       task=task)
    cfg = TrainConfig(global_batch_size=32, micro_batch_size=16, precision="fp32", seed=3,
                      warmup_ratio=0.0, lr=1e-3, max_shapes=4, **train)
    s = setup(cfg, model, len(data), CPU, task=task, lengths=data.lengths)
    s.model.eval()  # no dropout: the runs compared must compute the same function
    return s


@pytest.mark.integration
@pytest.mark.parametrize("task", ["single_label", "multi_label", "regression"])
def test_filler_rows_change_neither_the_loss_nor_any_gradient(tmp_path, tiny_model_dir, task):
    data = task_file(tmp_path / "t.arrow", task)
    s = planned_setup(tiny_model_dir, data, task, cuda_graphs="true")
    g = s.graphs
    # 5 rows whose longest is no planned width: the plan pads them wider and adds filler rows
    idx = np.flatnonzero(~np.isin(data.lengths, s.spec.widths))[:5]
    bare = BatchSpec(global_batch=5, micro_rows=5)  # the same rows, own width, no filler

    def loss_and_grads(host):
        s.optimizer.zero_grad(set_to_none=True)
        g.scale.fill_(1 / len(idx))
        _, buffers = graphs.load(g, host, CPU)
        graphs.forward_backward(s, buffers)
        loss = g.loss.clone()
        g.loss.zero_()
        return loss, [p.grad.clone() for p in s.model.parameters() if p.grad is not None]

    planned = collate(data, idx, 0, s.spec)
    assert planned["input_ids"].shape[0] == 16 and planned["weights"].sum() == 5
    assert planned["input_ids"].shape[1] > data.lengths[idx].max()  # padded wider, too
    loss_a, grads_a = loss_and_grads(planned)
    loss_b, grads_b = loss_and_grads(collate(data, idx, 0, bare))
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-6)
    assert len(grads_a) == len(grads_b) == sum(1 for p in s.model.parameters() if p.requires_grad)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def steps_of(s, data, path, n, oom=None):
    """`n` optimizer steps through feed and train_step (the loop's own); `oom(host)` -> True
    plants a CUDA out-of-memory error in that micro-batch's forward."""
    meter = StepMeter(CPU, Peak(1e12, "test"), s.model.config)
    losses, shapes_fed = [], []
    forward = graphs.forward_backward

    def planted(s_, buffers):
        shapes_fed.append(tuple(buffers["input_ids"].shape))
        if oom and oom(buffers):
            raise torch.OutOfMemoryError("CUDA out of memory (planted)")
        return forward(s_, buffers)

    def gather(idx):
        return collate(data, idx, 0, s.spec)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graphs, "forward_backward", planted)
        for step, batches in itertools.islice(feed(s, data, path, 0, epochs=3), n):
            result = train_step(s, step, batches, meter, data.lengths, gather)
            losses.append(float(result.loss))
    params = torch.cat([p.detach().flatten() for p in s.model.parameters()])
    return losses, params, shapes_fed


def test_the_shape_plan_learns_what_the_dynamic_step_learns(tmp_path, tiny_model_dir):
    """Same global batches, other padding, filler rows, the AdamW update with its learning rate
    on the device and gradients zeroed in place: the same losses and weights over 8 steps."""
    data = task_file(tmp_path / "t.arrow", "single_label", rows=300)
    planned = planned_setup(tiny_model_dir, data, "single_label", cuda_graphs="true")
    dynamic = planned_setup(tiny_model_dir, data, "single_label", cuda_graphs="false")
    assert planned.graphs is not None and dynamic.graphs is None
    assert isinstance(planned.optimizer.param_groups[0]["lr"], torch.Tensor)
    losses_p, params_p, fed = steps_of(planned, data, tmp_path / "t.arrow", 8)
    losses_d, params_d, _ = steps_of(dynamic, data, tmp_path / "t.arrow", 8)
    assert set(fed) <= set(planned.spec.shapes()) and len(set(fed)) > 1
    assert losses_p == pytest.approx(losses_d, rel=1e-5)
    torch.testing.assert_close(params_p, params_d, rtol=1e-4, atol=1e-6)


def test_an_out_of_memory_halving_starts_the_shapes_afresh(tmp_path, tiny_model_dir, capsys):
    data = task_file(tmp_path / "t.arrow", "single_label", rows=300)
    s = planned_setup(tiny_model_dir, data, "single_label", cuda_graphs="true")
    first = s.spec.shapes()
    widest = max(w for _, w in first)
    losses, params, fed = steps_of(s, data, tmp_path / "t.arrow", 6,
                                   oom=lambda b: b["input_ids"].shape[1] == widest
                                   and b["input_ids"].shape[0] == 16)
    assert s.halvings >= 1 and "out of memory" in capsys.readouterr().out
    assert s.spec.shapes() != first and s.spec.widths == tuple(w for _, w in first)
    assert set(s.graphs.buffers) <= set(s.spec.shapes())  # the old shapes' buffers are gone
    again = planned_setup(tiny_model_dir, data, "single_label", cuda_graphs="true",
                          micro_batch_tokens=s.spec.micro_tokens)
    losses_b, params_b, _ = steps_of(again, data, tmp_path / "t.arrow", 6)
    assert losses == pytest.approx(losses_b, rel=1e-5)
    torch.testing.assert_close(params, params_b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("flag,device,world,compile,path", [
    ("auto", "cpu", 1, False, "dynamic"), ("true", "cpu", 1, False, "planned"),
    ("false", "cuda", 1, False, "dynamic"), ("auto", "cuda", 1, False, "graphs"),
    ("true", "cuda", 1, False, "graphs"), ("auto", "cuda", 2, False, "graphs"),
    ("true", "cpu", 2, False, "planned"),
    ("auto", "cuda", 1, True, "dynamic")])
def test_cuda_graphs_flag_picks_the_path_it_says(flag, device, world, compile, path):
    chosen, why = graphs.choose(TrainConfig(cuda_graphs=flag, compile=compile),
                                torch.device(device), world)
    assert chosen == path and why


def test_cuda_graphs_true_with_compile_is_refused():
    with pytest.raises(ValueError, match="cuda_graphs true and train.compile true: choose one"):
        load_section({"train": {"cuda_graphs": "true", "compile": True}}, "train")
    with pytest.raises(ValueError, match="train.max_shapes must be >= 1"):
        load_section({"train": {"max_shapes": 0}}, "train")


@pytest.mark.parametrize("task", ["single_label", "multi_label", "regression"])
def test_validation_on_the_plans_shapes_gives_the_same_figures(tmp_path, tiny_model_dir, task):
    data = task_file(tmp_path / "v.arrow", task, rows=70, seed=5)
    planned = planned_setup(tiny_model_dir, data, task, cuda_graphs="true")
    dynamic = planned_setup(tiny_model_dir, data, task, cuda_graphs="false")
    a, logits_a = evaluate_split(planned, data, 0, 0, K, keep_logits=True)
    b, logits_b = evaluate_split(dynamic, data, 0, 0, K, keep_logits=True)
    assert a.keys() == b.keys() and len(a) >= 3
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
    # Every row's logits, in file order, whatever order the batches took.
    assert logits_a.shape == (70, K) and np.abs(logits_a).sum(1).min() > 0
    np.testing.assert_allclose(logits_a, logits_b, rtol=1e-4, atol=1e-5)
    assert evaluate_split(dynamic, data, 0, 0, K)[1] is None
