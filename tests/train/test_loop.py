"""The worker-side pieces that run without Ray: feeding, the step's loss normalisation."""

import numpy as np
import pytest
import torch

from wellfed.config import ModelConfig, TrainConfig
from wellfed.data.batching import BatchSpec, iterate_steps
from wellfed.data.token_files import TokenFile
from wellfed.model import load_model
from wellfed.telemetry.meter import StepMeter
from wellfed.telemetry.peak import Peak
from wellfed.train.step.feeding import micro_batches
from wellfed.train.step.setup import setup
from wellfed.train.step.step import train_step


@pytest.mark.parametrize("workers", [1, 2])
def test_loader_processes_feed_exactly_what_inline_gathering_feeds(token_file, workers):
    data = TokenFile(token_file)
    spec = BatchSpec(global_batch=16, world_size=2, micro_rows=4, seed=1)

    def fed(n_workers):
        steps = iterate_steps(data.lengths, spec, 1, epochs=2)
        return [(s.epoch, s.index, [{k: np.asarray(v) for k, v in b.items()} for b in batches])
                for s, batches in micro_batches(steps, data, token_file, 0, spec, n_workers, 2, False)]

    inline, loaded = fed(0), fed(workers)
    assert len(inline) == len(loaded) == 2 * 13
    for (e1, i1, b1), (e2, i2, b2) in zip(inline, loaded):
        assert (e1, i1) == (e2, i2) and len(b1) == len(b2)
        for x, y in zip(b1, b2):
            assert x.keys() == y.keys()
            for key in x:
                np.testing.assert_array_equal(x[key], y[key])


def test_loader_processes_outlive_a_signal_to_the_process_group(token_file):
    """SIGTERM/SIGINT sent to `dvc repro`'s group reach the loader processes too (in-process
    training: they are the stage's children); the run must still finish its step and checkpoint
    (train/checkpoints/preemption.py), so they ignore both."""
    import os
    import signal

    import psutil

    data = TokenFile(token_file)
    steps = iterate_steps(data.lengths, BatchSpec(global_batch=16, world_size=1, micro_rows=4,
                                                  seed=1), 0, epochs=1)
    fed = micro_batches(steps, data, token_file, 0, BatchSpec(global_batch=16), 2, 2, False)
    _, first = next(fed)
    list(first)
    loaders = psutil.Process().children()
    assert len(loaders) == 2
    for proc in loaders:
        os.kill(proc.pid, signal.SIGTERM)
        os.kill(proc.pid, signal.SIGINT)
    rest = [len(list(batches)) for _, batches in fed]  # the epoch's other steps, same loaders
    assert len(rest) == 12 and all(rest)


def run_one_step(token_file, tiny_model_dir, micro_rows, world=1):
    data = TokenFile(token_file)
    torch.manual_seed(0)
    model = load_model(ModelConfig(init="random"), str(tiny_model_dir), ["a", "b"])
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = 0.0
    cpu = torch.device("cpu")
    cfg = TrainConfig(global_batch_size=32, micro_batch_size=micro_rows, max_grad_norm=0,
                      precision="fp32", seed=3, warmup_ratio=0.0)
    s = setup(cfg, model, len(data), cpu, world)
    s.model.eval()  # no dropout: the two splits must see the same function
    step = next(iterate_steps(data.lengths, s.spec, 0))
    _, batches = next(micro_batches(iter([step]), data, token_file, 0, s.spec, 0, 2, False))
    meter = StepMeter(cpu, Peak(1e12, "test"), model.config)
    out = train_step(s, step, batches, meter, data.lengths)
    return torch.stack(out), len(step.micro), next(model.parameters()).detach().clone(), meter


def test_loss_and_update_do_not_depend_on_how_the_global_batch_is_split(token_file, tiny_model_dir):
    whole, n1, params1, meter = run_one_step(token_file, tiny_model_dir, micro_rows=32)
    split, n8, params8, _ = run_one_step(token_file, tiny_model_dir, micro_rows=4)
    assert (n1, n8) == (1, 8)  # 1 micro-batch versus 8 accumulated ones
    torch.testing.assert_close(whole, split, rtol=1e-4, atol=1e-5)  # same loss and grad norm
    torch.testing.assert_close(params1, params8, rtol=1e-4, atol=1e-6)  # same update
    interval = meter.interval()
    assert interval["local_rows"] == 32 and 0 <= interval["input_wait_share"] <= 1


def test_consecutive_non_finite_losses_are_counted_across_reports():
    from wellfed.train.step.loop import count_bad

    nan, inf = float("nan"), float("inf")
    assert count_bad(0, [0.5, nan, inf]) == 2
    assert count_bad(2, [nan]) == 3 and count_bad(3, [0.4]) == 0
    assert count_bad(1, [nan, 0.3, nan]) == 1


def test_preflight_refuses_what_this_machine_cannot_do(monkeypatch):
    from wellfed.config import RayConfig
    from wellfed.train.run.preflight import devices as preflight

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="fp16 needs a CUDA GPU"):
        preflight(TrainConfig(precision="fp16"), RayConfig())
    with pytest.raises(ValueError, match="ray.use_gpu is true but this machine has no CUDA GPU"):
        preflight(TrainConfig(), RayConfig(use_gpu="true"))
    preflight(TrainConfig(precision="auto"), RayConfig())  # fine on CPU


def test_a_worker_failure_becomes_one_line_naming_the_cause():
    from ray.train.v2.api.exceptions import WorkerGroupError

    from wellfed.train.run.failures import worker_failure

    err = WorkerGroupError("Traceback ...\nRuntimeError: boom", {
        1: RuntimeError("Traceback (most recent call last):\n  ...\nloss was not finite for 3 "
                        "consecutive steps (up to step 40); lower train.lr")})
    message = str(worker_failure(err))
    assert "\n" not in message
    assert message.startswith("training failed (worker 1: RuntimeError: loss was not finite for 3")
    assert "resumes from it" in message
