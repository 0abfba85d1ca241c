"""The token budget on CPU: a planted out-of-memory error halves it and redoes the step with the
same result, the probe's search finds the largest fit under an injected memory limit and leaves
nothing behind after an error in a backward, ranks agree on the smallest budget, and the config
takes `auto` and train.compile."""

from __future__ import annotations

import functools
import itertools
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from wellfed import device as dev
from wellfed.config import ModelConfig, TrainConfig, load_section
from wellfed.data.batching import BatchSpec, Step, collate, iterate_steps, padded_width
from wellfed.data.token_files import TokenFile
from wellfed.errors import StageError
from wellfed.model import load_model
from wellfed.telemetry.meter import StepMeter
from wellfed.telemetry.peak import Peak
from wellfed.train.step import autobatch
from wellfed.train.step.feeding import feed
from wellfed.train.step.setup import setup
from wellfed.train.step.step import train_step

CPU = torch.device("cpu")
STEPS = 4


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """A tiny model gains nothing from a second thread, and on this busy 2-core machine two
    spinning OpenMP threads made its backward 1.3 s instead of 0.015 s (measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def train_steps(token_file, model_dir, tokens, oom=None, compile=False, steps=STEPS):
    """`steps` optimizer steps of a tiny model (eval mode: no dropout, so runs that cut their
    batches differently compute the same function) through the loop's setup, feed and
    train_step; `oom(host)` -> True raises a planted CUDA out-of-memory error in the forward."""
    data = TokenFile(token_file)
    torch.manual_seed(0)
    model = load_model(ModelConfig(init="random"), str(model_dir), ["a", "b"])
    cfg = TrainConfig(global_batch_size=32, micro_batch_size=32, micro_batch_tokens=tokens,
                      precision="fp32", seed=3, warmup_ratio=0.0, lr=1e-3, compile=compile)
    s = setup(cfg, model, len(data), CPU, lengths=data.lengths)
    s.model.eval()
    widths, kept_masks = [], []
    forward = dev.forward

    def planted(model, batch, host, **kw):
        widths.append(host["input_ids"].size)
        kept_masks.append(kw.get("keep_mask", False))
        if oom and oom(host):
            raise torch.OutOfMemoryError("CUDA out of memory (planted)")
        return forward(model, batch, host, **kw)

    meter = StepMeter(CPU, Peak(1e12, "test"), model.config)
    def gather(idx):
        return collate(data, idx, 0, s.spec)

    losses, halvings, first = [], [], None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dev, "forward", planted)
        for step, batches in itertools.islice(feed(s, data, token_file, 0, epochs=2), steps):
            first = first or step
            losses.append(float(train_step(s, step, batches, meter, data.lengths, gather).loss))
            halvings.append(s.halvings)
    params = torch.cat([p.detach().flatten() for p in s.model.parameters()])
    return {"s": s, "params": params, "losses": losses, "tokens_fed": widths, "meter": meter,
            "kept_masks": kept_masks,
            "halvings": halvings, "first": first, "lengths": data.lengths}


def test_an_out_of_memory_step_is_halved_until_it_fits_and_learns_what_the_small_budget_does(
        token_file, tiny_model_dir, capsys):
    limit = 150  # padded tokens a micro-batch may hold before the planted error
    run = train_steps(token_file, tiny_model_dir, 0, oom=lambda h: h["input_ids"].size > limit)
    s = run["s"]
    lines = [line for line in capsys.readouterr().out.splitlines() if "out of memory" in line]
    budgets = [int(line.split("-> ")[1].split(";")[0]) for line in lines]
    first, lengths = run["first"], run["lengths"]
    whole = len(first.micro[0]) * padded_width(lengths[first.micro[0]].max(), 1)
    assert whole > 2 * limit and "micro_batch_tokens rows only ->" in lines[0]
    # Each budget is at most half the one before (half the largest micro-batch cut with it),
    # the last fits, and the one before it did not.
    assert budgets[0] == whole // 2 and len(budgets) >= 2
    assert all(b <= a // 2 for a, b in zip(budgets, budgets[1:]))
    assert budgets[-1] <= limit < budgets[-2] and s.spec.micro_tokens == budgets[-1]
    # All the halvings came in the first step: later ones were planned with the new budget.
    assert run["halvings"] == [len(budgets)] * STEPS
    assert sum(n > limit for n in run["tokens_fed"]) == len(budgets)
    assert run["meter"].interval()["local_rows"] == STEPS * 32  # a redone step counts once

    fitting = train_steps(token_file, tiny_model_dir, budgets[-1])
    assert fitting["s"].halvings == 0
    torch.testing.assert_close(run["params"], fitting["params"], rtol=1e-6, atol=1e-7)
    assert run["losses"] == pytest.approx(fitting["losses"], rel=1e-6)
    whole = train_steps(token_file, tiny_model_dir, 0)  # one micro-batch per step
    torch.testing.assert_close(run["params"], whole["params"], rtol=1e-4, atol=1e-6)
    assert run["losses"] == pytest.approx(whole["losses"], rel=1e-4)


def test_gradients_of_micro_batches_before_the_error_are_dropped(token_file, tiny_model_dir):
    calls = iter(range(10**6))
    # The second forward of the run fails once: the first micro-batch's gradient is already in
    # the parameters and must not count twice.
    run = train_steps(token_file, tiny_model_dir, 200, oom=lambda h: next(calls) == 1)
    assert run["s"].halvings == 1
    budget = run["s"].spec.micro_tokens
    assert budget < 200
    fitting = train_steps(token_file, tiny_model_dir, budget)
    torch.testing.assert_close(run["params"], fitting["params"], rtol=1e-6, atol=1e-7)


def test_one_row_that_does_not_fit_and_ddp_each_stop_with_the_fix(token_file):
    lengths = TokenFile(token_file).lengths
    spec = BatchSpec(global_batch=32, micro_rows=32)
    step = next(iterate_steps(lengths, spec, 0))
    width = padded_width(lengths[step.micro[0]].max(), 1)
    largest = len(step.micro[0]) * width
    assert autobatch.halved(spec, step, lengths, world=1) == largest // 2
    with pytest.raises(StageError, match=rf"2 workers .* set train.micro_batch_tokens: "
                                         rf"{largest // 2}$"):
        autobatch.halved(spec, step, lengths, world=2)
    one_row = Step(0, 0, 1, [step.micro[0][:1]])
    with pytest.raises(StageError, match=f"one row of {width} tokens .* does not fit"):
        autobatch.halved(spec, one_row, lengths, world=1)


def test_the_search_finds_the_largest_fit_under_an_injected_memory_limit():
    width, limit = 64, 1000 * 64  # memory for 1000 rows of 64 tokens
    asked = []

    def fits(rows):
        asked.append(rows)
        return rows * width <= limit

    rows = autobatch.largest_fit(fits, most=4096)
    assert fits(rows) and 1000 - 1000 // autobatch.BISECT_TO <= rows <= 1000
    assert len(asked) <= 2 * 12  # doubling to 1024, then a few bisection steps
    assert autobatch.budget_for(rows, width, 4096) == int(rows * width * autobatch.HEADROOM)
    # Everything a micro-batch can hold fits: the bound never binds, no headroom is taken off.
    assert autobatch.largest_fit(fits, most=500) == 500
    assert autobatch.budget_for(500, width, 500) == 500 * width
    assert autobatch.largest_fit(lambda rows: False, most=4096) == 0
    assert autobatch.budget_for(0, width, 4096) == 0
    exact = [autobatch.largest_fit(lambda r, n=n: r <= n, most=64) for n in range(1, 33)]
    assert exact == list(range(1, 33))  # up to 32 rows, the count is found exactly


def test_the_probe_leaves_no_gradient_stand_in_or_graph_after_an_error_in_the_backward(
        tiny_model_dir, monkeypatch):
    """The probe itself (autobatch.probe) on CPU, torch.cuda's memory calls stubbed: a CUDA
    out-of-memory error planted in the backward of every attempt over 5 rows, raised once the
    head's and the last layer's gradients are written. The search still finds 5 rows, and then
    no parameter holds a gradient, the optimizer-state stand-ins are freed, and so is every
    attempt's graph (its logits, and the activations they hold), freed as soon as the error is
    handled, not at a later garbage collection: on a GPU the next attempt needs that memory."""
    torch.manual_seed(0)
    model = load_model(ModelConfig(init="random"), str(tiny_model_dir), ["a", "b"]).train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    for name, stub in {"get_device_properties": lambda d: SimpleNamespace(total_memory=2**40),
                       "max_memory_reserved": lambda d=None: 0,
                       "synchronize": lambda d=None: None, "empty_cache": lambda: None,
                       "reset_peak_memory_stats": lambda d=None: None}.items():
        monkeypatch.setattr(torch.cuda, name, stub)
    rows_now, written_at_error, logits, stand_ins = [0], [], [], []

    def raise_in_backward(module, grad_in, grad_out):  # layer 0: runs after layer 1 and the head
        if rows_now[0] > 5:
            written_at_error.append(sum(p.grad is not None for p in trainable))
            raise torch.OutOfMemoryError("CUDA out of memory (planted in the backward)")

    model.bert.encoder.layer[0].register_full_backward_hook(raise_in_backward)
    forward, empty_like = dev.forward, torch.empty_like

    def recorded(model, batch, host, **kw):
        rows_now[0] = len(host["input_ids"])
        out = forward(model, batch, host, **kw)
        logits.append(weakref.ref(out))
        return out

    def recorded_empty_like(*args, **kw):
        stand_ins.append(weakref.ref(out := empty_like(*args, **kw)))
        return out

    monkeypatch.setattr(dev, "forward", recorded)
    monkeypatch.setattr(torch, "empty_like", recorded_empty_like)
    rows = autobatch.probe(model, CPU, dev.choose_precision("fp32", CPU), width=16, most=64)
    assert rows == 5
    assert len(written_at_error) == 2  # at 8 rows, then 6 (bisecting between 4 and 8)
    assert all(0 < n < len(trainable) for n in written_at_error)  # some, not all, written
    assert all(p.grad is None for p in trainable)
    assert len(stand_ins) == 2 * len(trainable) and all(ref() is None for ref in stand_ins)
    assert len(logits) == 6 and all(ref() is None for ref in logits)  # 1, 2, 4, 8, 6, 5 rows


def agree_worker(rank: int, init: str, out) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        out.put((rank, autobatch.agree([12_000, 7_000][rank], CPU)))
    finally:
        torch.distributed.destroy_process_group()


def test_ranks_agree_on_the_smallest_budget(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")  # spawn would import torch again in each (~4 s here)
    out = ctx.Queue()
    procs = [ctx.Process(target=agree_worker, args=(r, f"file://{tmp_path}/rendezvous", out))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert got == {0: 7_000, 1: 7_000}
    assert autobatch.agree(12_000, CPU) == 12_000  # no process group: its own


def test_auto_is_rows_only_on_cpu_and_says_why(token_file, tiny_model_dir):
    run = train_steps(token_file, tiny_model_dir, "auto", steps=1)
    assert run["s"].spec.micro_tokens == 0
    assert run["s"].budget_note.startswith("auto: CPU, rows only")


def test_config_takes_auto_or_a_count_and_refuses_anything_else():
    assert load_section({"train": {"micro_batch_tokens": "auto"}}, "train").micro_batch_tokens == "auto"
    assert load_section({"train": {"micro_batch_tokens": 8192}}, "train").micro_batch_tokens == 8192
    loaded = load_section({"train": {"micro_batch_tokens": "1e4"}}, "train")  # YAML 1.1: a str
    assert autobatch.choose(loaded.micro_batch_tokens, None, CPU, None, None,
                            BatchSpec(global_batch=32)) == (10_000, "set in params")
    for bad in ("big", -1, 2.5, True):
        with pytest.raises(ValueError, match=r"train.micro_batch_tokens must be an integer >= 0 "
                                             r"\(0 = rows only\) or auto"):
            load_section({"train": {"micro_batch_tokens": bad}}, "train")
    assert load_section({"train": {"compile": True}}, "train").compile is True
    with pytest.raises(ValueError, match="train.compile must be true or false"):
        load_section({"train": {"compile": "yes"}}, "train")


def test_forward_drops_an_unpadded_batch_mask_unless_told_to_keep_it():
    """Eager: no mask takes the faster unmasked attention; compiled: the mask always goes in, so
    unpadded batches reuse the padded batches' graphs."""
    seen = []

    class Stub(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None):
            seen.append(attention_mask)
            return SimpleNamespace(logits=input_ids.float())

    host = {"input_ids": np.ones((2, 3), np.int64), "attention_mask": np.ones((2, 3), np.int64)}
    batch = dev.to_device(host, CPU)
    dev.forward(Stub(), batch, host)
    dev.forward(Stub(), batch, host, keep_mask=True)
    assert seen[0] is None and seen[1] is batch["attention_mask"]


def compiled_vs_eager(token_file, model_dir) -> None:
    """2 steps with train.compile on and off: the same losses and weights, and the model that
    validation and checkpoints use is the plain one."""
    from wellfed.train.checkpoints.checkpoint import unwrap

    eager = train_steps(token_file, model_dir, 0, steps=2)
    compiled = train_steps(token_file, model_dir, 0, compile=True, steps=2)
    s = compiled["s"]
    assert s.compiled is not None and s.compiled is not s.model
    assert not any("_orig_mod" in key for key in unwrap(s.model).state_dict())
    assert len(compiled["kept_masks"]) == len(compiled["tokens_fed"]) > 0
    assert all(compiled["kept_masks"]) and not any(eager["kept_masks"])  # one graph family
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-4)
    torch.testing.assert_close(compiled["params"], eager["params"], rtol=1e-4, atol=1e-5)


@pytest.mark.integration
def test_compile_mechanics_with_dynamo_and_the_eager_backend(token_file, tiny_model_dir,
                                                             monkeypatch):
    """Dynamo captures the step's graphs, torch runs them as they are (no inductor codegen):
    the wiring in seconds; the inductor test below is the real thing and takes minutes."""
    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    compiled_vs_eager(token_file, tiny_model_dir)


@pytest.mark.slow
def test_compiled_training_with_inductor_matches_eager(token_file, tiny_model_dir):
    """inductor on CPU: 148 s here on a busy 2-core machine (C++ codegen and compile)."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import InductorError

    torch._dynamo.reset()
    try:
        compiled_vs_eager(token_file, tiny_model_dir)
    except (BackendCompilerFailed, InductorError) as err:  # e.g. no C++ compiler for inductor
        pytest.skip(f"inductor cannot compile here ({str(err).splitlines()[0]}); the eager "
                    "backend test covers the mechanics")
