"""The CUDA paths on a real GPU: precision choice, fp16 + GradScaler, the CUDA-event step meter,
the NVML sampler, pinned non-blocking copies and a short bf16 training run.

Skipped without a CUDA device (CI has none); run on a GPU machine with
`python -m pytest tests/gpu -m cuda`. Models are tiny random-init BERTs built from a config, so
nothing is downloaded.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from wellfed import device as dev
from wellfed.config import TrainConfig
from wellfed.data.batching import Step
from wellfed.telemetry.meter import StepMeter
from wellfed.telemetry.peak import Peak, device_peak
from wellfed.train.step.setup import setup
from wellfed.train.step.step import train_step

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda", 0)
VOCAB = 1000


def bert(hidden: int = 64, layers: int = 2, seed: int = 0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=4, intermediate_size=4 * hidden, num_labels=2)
    return BertForSequenceClassification(config).to(CUDA).train()


def host_batch(rows: int, width: int, rng: np.random.Generator, padded: bool = True) -> dict:
    """A host micro-batch as `collate` returns it; label 1 iff token 7 occurs (learnable)."""
    lens = rng.integers(width // 2, width + 1, rows) if padded else np.full(rows, width)
    mask = (np.arange(width)[None, :] < lens[:, None]).astype(np.int64)
    ids = rng.integers(10, VOCAB, (rows, width))
    plant = rng.random(rows) < 0.5
    ids[plant, 1] = 7
    return {"input_ids": np.where(mask == 1, ids, 0), "attention_mask": mask,
            "labels": plant.astype(np.int64), "weights": np.ones(rows, np.float32)}


class Run:
    """The loop's own setup and step (wellfed.train.step.loop.setup / train_step) on the GPU."""

    def __init__(self, model, precision: str, lr: float = 1e-3, compile: bool = False):
        # The dynamic step (the planned one: tests/gpu/test_graphs.py): these steps are hand-cut.
        self.cfg = TrainConfig(lr=lr, precision=precision, max_grad_norm=1.0, warmup_ratio=0.0,
                               compile=compile, cuda_graphs="false")
        self.s = setup(self.cfg, model, 10_000, CUDA)
        self.model, self.precision, self.scaler = model, self.s.precision, self.s.scaler
        self.meter = StepMeter(CUDA, Peak(1e15, "test"), model.config)

    def step(self, micro: list[dict]) -> torch.Tensor:
        rows = [len(b["labels"]) for b in micro]
        lengths = np.full(max(rows), micro[0]["input_ids"].shape[1])
        step = Step(0, 0, sum(rows), [np.arange(r) for r in rows])
        return torch.stack(train_step(self.s, step, iter(micro), self.meter, lengths))


def test_auto_precision_is_bf16_on_an_ampere_or_newer_gpu_and_says_why():
    precision = dev.choose_precision("auto", CUDA)
    name = dev.device_name(CUDA)
    if torch.cuda.is_bf16_supported():
        assert precision.name == "bf16" and not precision.needs_scaler
        assert precision.reason == f"auto: {name} supports bf16"
    else:
        assert precision.name == "fp16" and precision.needs_scaler
    assert dev.pad_multiple(0, CUDA) == 8


def test_fp16_gradscaler_skips_an_overflowing_step_and_counts_it():
    run = Run(bert(), "fp16")
    rng = np.random.default_rng(0)
    before = [p.detach().clone() for p in run.model.parameters()]
    scale = run.scaler.get_scale()
    # An infinite gradient in one parameter: GradScaler must find it, skip the update, halve the scale.
    hook = run.model.classifier.weight.register_hook(lambda g: g * float("inf"))
    loss, _, skipped = run.step([host_batch(16, 24, rng)]).tolist()
    hook.remove()
    assert skipped == 1.0 and np.isfinite(loss)
    assert run.scaler.get_scale() == scale / 2
    assert all(torch.equal(a, b) for a, b in zip(before, run.model.parameters()))
    _, _, skipped = run.step([host_batch(16, 24, rng)]).tolist()
    assert skipped == 0.0
    assert not all(torch.equal(a, b) for a, b in zip(before, run.model.parameters()))


def test_meter_cuda_event_compute_time_matches_a_synchronized_wall_clock():
    run = Run(bert(hidden=256, layers=4), "bf16")
    rng = np.random.default_rng(1)
    batches = [[host_batch(64, 128, rng), host_batch(64, 128, rng)] for _ in range(12)]
    for micro in batches[:3]:  # warm-up: kernels, cuBLAS handles, the fused optimizer
        run.step(micro)
    torch.cuda.synchronize()
    run.meter.reset()
    start = time.perf_counter()
    for micro in batches[3:]:
        run.step(micro)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    figures = run.meter.interval()
    # Compute excludes input wait and the host side of the copies; both are tiny here.
    assert figures["compute_s"] == pytest.approx(wall - figures["input_wait_s"] - figures["copy_s"],
                                                 rel=0.10)
    assert figures["local_rows"] == 9 * 128


def test_nvml_sampler_reads_this_process_gpu():
    import pynvml

    from wellfed.telemetry.gpu import DeviceSampler

    sampler = DeviceSampler(CUDA, interval_s=0.1).start()
    block = torch.empty(2**30, dtype=torch.uint8, device=CUDA)  # 1 GiB this process holds
    a = torch.randn(4096, 4096, device=CUDA, dtype=torch.bfloat16)
    deadline = time.perf_counter() + 1.0
    while time.perf_counter() < deadline:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    snap = sampler.snapshot()
    sampler.stop()
    assert sampler.kind == "gpu"
    uuid = str(torch.cuda.get_device_properties(CUDA).uuid)
    assert pynvml.nvmlDeviceGetUUID(sampler._handle).removeprefix("GPU-") == uuid.removeprefix("GPU-")
    total = torch.cuda.get_device_properties(CUDA).total_memory / 2**30
    assert snap["gpu_mem_total_gb"] == pytest.approx(total, rel=0.02)
    assert snap["gpu_mem_used_gb"] >= 1.0 and snap["torch_max_allocated_gb"] >= 1.0
    assert snap["gpu_util_pct"] > 0 and snap["gpu_power_w"] > 0 and snap["gpu_sm_clock_mhz"] > 0
    del block


def test_pinned_non_blocking_copies_leave_the_host_free_while_the_gpu_computes():
    """to_device pins and copies with non_blocking=True: the host returns at once and can gather
    the next batch while the GPU is still busy (the copy itself queues behind the compute)."""
    rng = np.random.default_rng(2)
    host = host_batch(256, 128, rng)
    a = torch.randn(8192, 8192, device=CUDA, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(100):  # ~1 TFLOP each: well over 100 ms of queued GPU work
        a = (a @ a).clamp_(-1, 1)
    queued = time.perf_counter()
    batch = dev.to_device(host, CUDA)
    returned = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    assert returned - queued < 0.05 < done - returned  # the host did not wait for the GPU
    assert all(t.is_cuda for t in batch.values())
    assert np.array_equal(batch["input_ids"].cpu().numpy(), host["input_ids"])
    assert done - start > 0.1


def test_bf16_training_on_cuda_learns_and_the_peak_comes_from_the_table():
    run = Run(bert(hidden=128, layers=2), "auto", lr=2e-3)
    rng = np.random.default_rng(3)
    losses = [float(run.step([host_batch(32, 32, rng)])[0]) for _ in range(80)]
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    precision = run.precision
    peak = device_peak(CUDA, dev.device_name(CUDA), precision.name, precision.dtype)
    if any(k in dev.device_name(CUDA) for k in ("H100", "H200", "A100", "L4", "L40S", "A10G")):
        assert peak.source.startswith("table:")


def test_train_step_does_not_synchronise_the_host_on_unpadded_batches():
    """The host must run ahead of the GPU: no step-level .item(), no host scalar copied to the
    device. (Padded batches still sync once inside transformers' SDPA mask builder; unpadded
    ones are passed without a mask, so the whole step must be sync-free.)"""
    run = Run(bert(), "bf16")
    rng = np.random.default_rng(4)
    run.step([host_batch(16, 24, rng, padded=False)])  # warm-up: allocator, cuBLAS, optimizer state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run.step([host_batch(16, 24, rng, padded=False), host_batch(16, 24, rng, padded=False)])
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_compiled_steps_match_eager_in_one_family_of_graphs(monkeypatch):
    """train.compile with inductor on the GPU: batches of changing width, padded and not,
    compile at most 2 graphs (the first shape, then one with the width symbolic) and give the
    eager step's losses. An unpadded batch keeps its mask: without it, the mask-less graphs
    were a second family, and on an H100 inductor stalled over 7 minutes compiling one."""
    if not hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        pytest.skip("this torch cannot fail on a recompile limit")
    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    monkeypatch.setattr(torch._dynamo.config, "fail_on_recompile_limit_hit", True)
    rng = np.random.default_rng(7)
    batches = [host_batch(16, width, rng, padded=padded)
               for width, padded in ((16, True), (24, False), (32, True), (8, False), (40, True))]
    eager, compiled = Run(bert(seed=1), "bf16"), Run(bert(seed=1), "bf16", compile=True)
    assert compiled.s.compiled is not None
    losses = []
    for run in (eager, compiled):
        run.model.eval()  # no dropout: inductor draws its own random masks
        losses.append([float(run.step([b])[0]) for b in batches])
    # A sanity check (a random-init model sits near ln 2 whatever it computes); the graph count
    # above is the point of the test.
    assert losses[1] == pytest.approx(losses[0], rel=1e-2)  # bf16 kernels differ, not the math


@pytest.mark.parametrize("cuda_graphs", ["false", "auto"])
def test_auto_budget_probe_finds_a_fitting_budget_on_the_device(cuda_graphs):
    """micro_batch_tokens auto on the real GPU, bounded by a planted memory fraction so the
    search meets a real CUDA out-of-memory error: the budget is > 0, below what was asked for,
    and a micro-batch of that many tokens then trains. The probe leaves nothing behind: no
    gradient values, no optimizer state, no memory beyond what the step's path holds by design.
    On the planned path (cuda_graphs auto, one CUDA worker) that is every gradient bound to a
    zeroed flat buffer after the probe (graphs.create -> gradients.bind, which keeps whatever a
    gradient held, so a leftover would show as a non-zero value); on the dynamic path, None."""
    from wellfed.train.step import gradients

    model = bert(hidden=256, layers=4)
    warm_up(model)  # cuBLAS handles and workspaces, held from here on, into the baseline
    trainable = [p for p in model.parameters() if p.requires_grad]
    placeholders = 2 * 4 * sum(p.numel() for p in trainable)  # the probe's AdamW stand-ins
    cfg = TrainConfig(precision="bf16", micro_batch_tokens="auto", global_batch_size=1 << 16,
                      micro_batch_size=1 << 16, warmup_ratio=0.0, cuda_graphs=cuda_graphs)
    lengths = np.full(1 << 16, 128)
    total = torch.cuda.get_device_properties(CUDA).total_memory
    base = torch.cuda.memory_allocated(CUDA)
    ooms = torch.cuda.memory_stats(CUDA).get("num_ooms", 0)
    torch.cuda.set_per_process_memory_fraction(min(1.0, 4 * 2**30 / total), CUDA)  # ~4 GiB
    try:
        s = setup(cfg, model, len(lengths), CUDA, lengths=lengths)
        tokens = s.spec.micro_tokens
        assert 128 <= tokens < (1 << 16) * 128 and s.budget_note.startswith("auto: probed")
        assert torch.cuda.memory_stats(CUDA)["num_ooms"] > ooms  # the error path did run
        if cuda_graphs == "false":
            assert s.graphs is None and all(p.grad is None for p in trainable)
            by_design = 0
        else:
            assert s.graphs is not None and gradients.bound(s.graphs.flat, model)
            assert not any(bool(b.any()) for b in s.graphs.flat.buffers)
            by_design = sum(b.numel() * b.element_size() for b in s.graphs.flat.buffers)
        assert not s.optimizer.state
        # A leaked attempt would hold GBs of activations, leaked stand-ins `placeholders` bytes.
        assert torch.cuda.memory_allocated(CUDA) - base - by_design < placeholders // 2
        rows = tokens // 128
        host = host_batch(rows, 128, np.random.default_rng(5), padded=True)
        step = Step(0, 0, rows, [np.arange(rows)])
        meter = StepMeter(CUDA, Peak(1e15, "test"), model.config)
        loss = train_step(s, step, iter([host]), meter, np.full(rows, 128)).loss
        assert torch.isfinite(loss) and s.halvings == 0
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, CUDA)
        torch.cuda.empty_cache()


def warm_up(model) -> None:
    """One bf16 forward and backward of `model`, gradients then dropped: the first matmuls of
    the host thread and of autograd's device thread allocate cuBLAS workspaces that stay."""
    host = host_batch(8, 32, np.random.default_rng(0))
    batch = dev.to_device(host, CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = dev.forward(model, batch, host)
    logits.float().sum().backward()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(CUDA)


def test_a_step_that_runs_out_of_gpu_memory_is_halved_and_redone(capsys):
    """A planted memory fraction that one micro-batch of 4,096 x 128 tokens does not fit: the
    step halves the budget until it fits, and the loss is that of the whole batch."""
    import dataclasses

    model = bert(hidden=256, layers=4)
    run = Run(model, "bf16")
    rows, width = 4096, 128
    run.s.spec = dataclasses.replace(run.s.spec, micro_rows=rows)  # only tokens bound a part
    rng = np.random.default_rng(6)
    full = host_batch(rows, width, rng)

    def gather(idx):
        return {k: v[idx] for k, v in full.items()}

    lengths = np.full(rows, width)
    step = Step(0, 0, rows, [np.arange(rows)])
    base = torch.cuda.memory_allocated(CUDA)
    total = torch.cuda.get_device_properties(CUDA).total_memory
    torch.cuda.set_per_process_memory_fraction((base + 3 * 2**30) / total, CUDA)  # +3 GiB
    try:
        loss = train_step(run.s, step, iter([gather(np.arange(rows))]), run.meter, lengths,
                          gather).loss
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, CUDA)
        torch.cuda.empty_cache()
    printed = [line for line in capsys.readouterr().out.splitlines() if "out of memory" in line]
    assert run.s.halvings >= 1 and len(printed) == run.s.halvings
    assert run.s.spec.micro_tokens <= rows * width // 2
    assert torch.isfinite(loss) and 0.3 < float(loss) < 1.5  # about ln 2 at random init
