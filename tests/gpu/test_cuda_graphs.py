"""The CUDA graph step on a real GPU: a graphed run equals the same plan run eagerly (bf16, shape
changes, dropout on and off), no host sync once the shapes are captured, a capture failure falls
back to eager, an out-of-memory halving re-captures, and fp16 + GradScaler and LoRA graph too.

Skipped without a CUDA device (CI has none): `python -m pytest tests/gpu -m cuda` on a GPU box.
Tiny random-init BERTs (conftest's tiny_model_dir) through the loop's own setup, feed and
train_step; 30 steps of global batch 32 in micro-batches of 16 over 4 planned shapes.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from wellfed.config import ModelConfig, TrainConfig
from wellfed.data.batching import collate
from wellfed.data.token_files import TokenFile
from wellfed.model import load_model
from wellfed.telemetry.meter import StepMeter
from wellfed.telemetry.peak import Peak
from wellfed.train.step import graphs
from wellfed.train.step.feeding import feed
from wellfed.train.step.setup import setup
from wellfed.train.step.step import train_step

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda", 0)
STEPS = 30


def run(model_dir, token_file, *, capture=True, dropout=True, precision="bf16", lora=0,
        steps=STEPS, oom=None, tokens=0, until_captured=False):
    """`steps` optimizer steps through the planned path; capture=False runs the same plan
    eagerly. `oom(buffers)` -> True plants an out-of-memory error in that micro-batch's
    forward. Returns (setup, per-step losses, final weights)."""
    data = TokenFile(token_file)
    torch.manual_seed(0)
    model = load_model(ModelConfig(init="random", lora_r=lora), str(model_dir), ["a", "b"])
    cfg = TrainConfig(global_batch_size=32, micro_batch_size=16, micro_batch_tokens=tokens,
                      precision=precision, seed=3, warmup_ratio=0.1, lr=1e-3, max_shapes=4,
                      cuda_graphs="true")
    s = setup(cfg, model.to(CUDA), len(data), CUDA, lengths=data.lengths)
    s.graphs.capture = capture
    if not dropout:
        s.model.eval()
    torch.manual_seed(cfg.seed)
    meter = StepMeter(CUDA, Peak(1e15, "test"), s.model.config)
    forward = graphs.forward_backward

    def planted(s_, buffers):
        if oom and oom(buffers):
            raise torch.OutOfMemoryError("CUDA out of memory (planted)")
        return forward(s_, buffers)

    def gather(idx):
        return collate(data, idx, 0, s.spec)

    results = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graphs, "forward_backward", planted)
        for step, batches in itertools.islice(feed(s, data, token_file, 0, epochs=100), steps):
            results.append(train_step(s, step, batches, meter, data.lengths, gather))
            if until_captured and set(s.spec.shapes()) <= set(s.graphs.micro):
                break
    losses = torch.stack([r.loss for r in results]).tolist()
    weights = torch.cat([p.detach().float().flatten() for p in s.model.parameters()])
    return s, losses, weights


def assert_same_learning(a, b, loss_tol, weight_tol):
    (_, losses_a, w_a), (_, losses_b, w_b) = a, b
    gap = max(abs(x - y) for x, y in zip(losses_a, losses_b))
    drift = float((w_a - w_b).norm() / w_b.norm())
    print(f"\nmax loss gap {gap:.2e}, weight drift {drift:.2e} over {len(losses_a)} steps")
    assert len(losses_a) == len(losses_b) and gap <= loss_tol and drift <= weight_tol


@pytest.mark.parametrize("dropout", [False, True])
def test_a_graphed_run_equals_the_same_plan_run_eagerly(tiny_model_dir, token_file, dropout):
    graphed = run(tiny_model_dir, token_file, dropout=dropout)
    eager = run(tiny_model_dir, token_file, capture=False, dropout=dropout)
    g = graphed[0].graphs
    assert not g.failed and g.full_mask and g.update is not None
    assert len(g.micro) >= 2 and g.replays > g.eager  # several shapes, mostly replayed
    assert eager[0].graphs.replays == 0
    # Replays draw dropout from the same generator offsets as eager launches.
    assert_same_learning(graphed, eager, 2e-2, 2e-2)


def test_no_host_sync_once_every_shape_is_captured(tiny_model_dir, token_file):
    s, _, _ = run(tiny_model_dir, token_file, steps=400, until_captured=True)
    assert set(s.spec.shapes()) <= set(s.graphs.micro)
    assert_no_host_sync(s, token_file)


def assert_no_host_sync(s, token_file, steps=20):
    """`steps` more steps of a captured setup `s` with CUDA's sync debug mode raising on any
    host sync, each loss finite."""
    data = TokenFile(token_file)
    meter = StepMeter(CUDA, Peak(1e15, "test"), s.model.config)
    fed = feed(s, data, token_file, 0, epoch=0, epochs=100)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = [train_step(s, step, batches, meter, data.lengths)
                   for step, batches in itertools.islice(fed, steps)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(results) == steps and all(np.isfinite(float(r.loss)) for r in results)


def run_with_a_failing_capture(model_dir, token_file, monkeypatch, dropout):
    """`run` with a host sync planted in the forward while capturing: every capture fails."""
    forward = graphs.forward_backward

    def syncs_in_capture(s, buffers):
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()  # not allowed while capturing: the capture fails
        return forward(s, buffers)

    monkeypatch.setattr(graphs, "forward_backward", syncs_in_capture)
    try:
        return run(model_dir, token_file, dropout=dropout)
    finally:
        monkeypatch.setattr(graphs, "forward_backward", forward)


@pytest.mark.parametrize("dropout", [False, True])
def test_a_capture_failure_falls_back_to_eager_and_learns_the_same(tiny_model_dir, token_file,
                                                                    monkeypatch, capsys, dropout):
    """Dropout on too: the failed capture must leave the random generator usable, and the
    fallback draws the masks an eager run draws."""
    fallen = run_with_a_failing_capture(tiny_model_dir, token_file, monkeypatch, dropout)
    g = fallen[0].graphs
    assert g.failed and not g.capture and not g.micro and g.replays == 0
    assert "CUDA graph capture failed" in capsys.readouterr().out
    eager = run(tiny_model_dir, token_file, capture=False, dropout=dropout)
    assert_same_learning(fallen, eager, 1e-3, 1e-3)


def test_an_out_of_memory_halving_captures_the_new_shapes(tiny_model_dir, token_file, capsys):
    first = run(tiny_model_dir, token_file, steps=1)[0].spec.shapes()
    widest = max(w for _, w in first)
    halved = run(tiny_model_dir, token_file, dropout=False,
                 oom=lambda b: tuple(b["input_ids"].shape) == (16, widest))
    s = halved[0]
    assert s.halvings == 1 and "out of memory" in capsys.readouterr().out
    assert set(s.graphs.micro) <= set(s.spec.shapes()) and (16, widest) not in s.graphs.micro
    assert s.graphs.replays > 0 and s.graphs.update is not None
    fitting = run(tiny_model_dir, token_file, dropout=False, tokens=s.spec.micro_tokens)
    assert_same_learning(halved, fitting, 2e-2, 2e-2)


def test_fp16_graphs_the_micro_batches_and_keeps_the_gradscaler_eager(tiny_model_dir,
                                                                      token_file):
    graphed = run(tiny_model_dir, token_file, precision="fp16", dropout=False)
    eager = run(tiny_model_dir, token_file, precision="fp16", dropout=False, capture=False)
    g = graphed[0].graphs
    assert g.update is None and g.micro and not g.failed  # the scaler reads its flag on the host
    assert_same_learning(graphed, eager, 2e-2, 2e-2)


def test_lora_adapters_train_under_graphs_as_eagerly(tiny_model_dir, token_file):
    graphed = run(tiny_model_dir, token_file, lora=4, dropout=False)
    eager = run(tiny_model_dir, token_file, lora=4, dropout=False, capture=False)
    assert graphed[0].graphs.micro and not graphed[0].graphs.failed
    assert_same_learning(graphed, eager, 2e-2, 2e-2)
