"""The training loop: `train` runs in-process on one device (tests, benchmarks, a debugger) and,
unchanged, on every Ray Train worker (train/worker.py adapts Ray's context to it).

`setup` builds the model's optimizer, schedule, scaler and batch plan the same way for all of
them (the micro-batch token budget: train/autobatch.py); `train_step` is one optimizer step and
fits on one screen. Every copy of the loop reports every `report_every` steps through the
`report` function it was given (never every step: under Ray each report can wait on the
controller's 2 s poll); the sinks decide what lands where.
Losses and token counts stay on the device between reports and cross to the host once per report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch

from wellfed import device as dev
from wellfed import tasks
from wellfed.config import DataConfig, ModelConfig, TrainConfig
from wellfed.data.batching import (BatchSpec, MicroBatches, Step, collate, eval_batches,
                                   iterate_steps, steps_per_epoch)
from wellfed.data.shards import TokenFile
from wellfed.model import load_model
from wellfed.telemetry.gpu import DeviceSampler
from wellfed.telemetry.meter import StepMeter
from wellfed.telemetry.peak import device_peak
from wellfed.telemetry.phases import Phases
from wellfed.train import autobatch, checkpoint, selection
from wellfed.train.checkpoint import unwrap

Report = Callable[[dict, "Path | None"], None]
"""report(metrics, checkpoint_dir or None): called on every rank; under Ray, ray.train.report."""


@dataclass(frozen=True)
class TrainJob:
    """What defines one training run, the same on every worker: typed params and token files."""

    train: TrainConfig
    data: DataConfig
    model: ModelConfig
    tokens_dir: Path
    """Folder holding train.arrow and validation.arrow (this node's copy)."""
    model_source: str
    """Packaged default, local directory or Hub id, as resolved by the tokenize stage."""
    labels: tuple[str, ...]
    """Class names in id order (regression: the target names)."""
    pad_id: int
    task: str = "single_label"
    """single_label, multi_label or regression (wellfed.tasks)."""


@dataclass(frozen=True)
class Place:
    """Where one copy of the loop runs."""

    device: torch.device
    rank: int = 0
    world: int = 1
    node: str = "local"


@dataclass
class Setup:
    """A model and everything that steps it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    precision: dev.Precision
    spec: BatchSpec
    steps: int
    """Optimizer steps planned for the whole run."""
    device: torch.device
    world: int
    max_grad_norm: float
    task: str = "single_label"
    loss_weights: torch.Tensor | None = None
    """Per-class loss weights on the device (train.class_weights), or None."""
    compiled: torch.nn.Module | None = None
    """torch.compile of `model` (train.compile), which the step runs; None = `model` itself.
    Validation and checkpoints use `model`."""
    budget_note: str = ""
    """How spec.micro_tokens was chosen (set in params, or what the auto probe found)."""
    halvings: int = 0
    """Times a CUDA out-of-memory error halved spec.micro_tokens during the run."""


class StepResult(NamedTuple):
    """One optimizer step's figures, still on the device."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    skipped: torch.Tensor
    """1.0 when fp16's GradScaler found an overflow and skipped the update."""


def build_optimizer(model, cfg: TrainConfig):
    """AdamW without decay on biases/norms; the fused kernel where torch has one for the device
    (CPU and CUDA): on this CPU a MiniLM optimizer step took 0.34 s fused vs 1.2 s foreach."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "norm" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without a fused kernel
        return torch.optim.AdamW(groups, lr=cfg.lr)


def total_steps(n_rows: int, cfg: TrainConfig) -> int:
    planned = cfg.epochs * steps_per_epoch(n_rows, cfg.global_batch_size)
    return min(planned, cfg.max_steps) if cfg.max_steps else planned


def setup(cfg: TrainConfig, model, n_rows: int, device: torch.device, world: int = 1,
          task: str = "single_label", loss_weights: torch.Tensor | None = None,
          lengths: np.ndarray | None = None) -> Setup:
    """Optimizer, warmup + linear decay, GradScaler and batch plan for `model` (already on its
    device, DDP-wrapped under Ray), in train mode: from_pretrained returns eval mode.
    `lengths` (the train rows' token counts) is needed by micro_batch_tokens auto, whose probe
    runs at the longest row."""
    from transformers import get_linear_schedule_with_warmup

    precision = dev.choose_precision(cfg.precision, device)
    model.train()
    optimizer = build_optimizer(model, cfg)
    steps = total_steps(n_rows, cfg)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * steps), steps)
    spec = BatchSpec(global_batch=cfg.global_batch_size, world_size=world,
                     micro_rows=cfg.micro_batch_size, micro_tokens=0,
                     pad_multiple=dev.pad_multiple(cfg.pad_multiple, device), seed=cfg.seed,
                     pool_batches=cfg.pool_batches)
    tokens, note = autobatch.choose(cfg.micro_batch_tokens, model, device, precision, lengths,
                                    spec)
    # dynamic=None is torch.compile's automatic dynamic shapes: the first shape compiles a static
    # graph, the first change of rows or width recompiles once with those sizes symbolic, and
    # later shapes reuse that graph. dynamic=False would compile one graph per (rows, width) up
    # to dynamo's recompile limit (8), then run eager; mark_dynamic by hand needs a call per batch.
    compiled = torch.compile(model, dynamic=None) if cfg.compile else None
    return Setup(model, optimizer, scheduler, dev.grad_scaler(device, precision), precision,
                 dataclasses.replace(spec, micro_tokens=tokens), steps, device, world,
                 cfg.max_grad_norm, task, None if loss_weights is None else loss_weights.to(device),
                 compiled, note)


def feed(s: Setup, data: TokenFile, path: Path, pad_id: int, rank: int = 0, epoch: int = 0,
         index: int = 0, epochs: int = 1, loader_workers: int = 0, prefetch: int = 2):
    """(step, host micro-batches) of this rank from (epoch, index) on, cut with `s.spec`. After
    a step halved the token budget, the rest is planned again with the new one: the global
    batches do not depend on the budget, only their cut into micro-batches does."""
    while True:
        spec = s.spec
        plan = iterate_steps(data.lengths, spec, rank, epoch, index, epochs)
        for step, batches in micro_batches(plan, data, path, pad_id, spec.pad_multiple,
                                           loader_workers, prefetch, s.device.type == "cuda"):
            yield step, batches
            if s.spec != spec:
                epoch, index = step.epoch, step.index + 1
                break
        else:
            return


def ignore_stop_signals(_worker_id: int) -> None:
    """A loader process ignores SIGTERM and SIGINT: sent to the run's process group, they are
    for the driver, which stops after the step under way (train/preemption.py) and needs its
    loaders until then; the loader processes end with their parent."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def micro_batches(steps: Iterator[Step], data: TokenFile, path: Path, pad_id: int, multiple: int,
                  loader_workers: int, prefetch: int, pin: bool):
    """Yield (step, host micro-batches) in plan order; with loader_workers > 0 a torch
    DataLoader gathers ahead in background processes, one epoch at a time."""
    if loader_workers == 0:
        for step in steps:
            yield step, (collate(data, idx, pad_id, multiple) for idx in step.micro)
        return
    epoch_steps: list[Step] = []

    def flush():
        plan = [idx for s in epoch_steps for idx in s.micro]
        loader = iter(torch.utils.data.DataLoader(
            MicroBatches(str(path), plan, pad_id, multiple), batch_size=None, shuffle=False,
            num_workers=loader_workers, prefetch_factor=prefetch, pin_memory=pin,
            worker_init_fn=ignore_stop_signals))
        for s in epoch_steps:
            yield s, (next(loader) for _ in s.micro)

    for step in steps:
        if epoch_steps and step.epoch != epoch_steps[-1].epoch:
            yield from flush()
            epoch_steps = []
        epoch_steps.append(step)
    if epoch_steps:
        yield from flush()


def accumulate(s: Setup, step: Step, batches: Iterator[dict], meter: StepMeter,
               lengths: np.ndarray) -> torch.Tensor:
    """Forward and backward of this rank's micro-batches of `step`, gradients summed in the
    parameters; returns the step's loss, still on the device."""
    model = s.model if s.compiled is None else s.compiled
    no_sync = getattr(s.model, "no_sync", contextlib.nullcontext)
    loss_sum = torch.zeros((), device=s.device)
    rows_n = real = padded = 0
    for i, idx in enumerate(step.micro):
        with meter.waiting():
            host = next(batches)
        with meter.copying():
            batch = dev.to_device(host, s.device)
        rows_n, real = rows_n + len(idx), real + int(lengths[idx].sum())
        padded += int(np.prod(host["input_ids"].shape))
        last = i == len(step.micro) - 1
        with meter.computing(), (contextlib.nullcontext() if last else no_sync()):
            with dev.autocast(s.device, s.precision):
                logits = dev.forward(model, batch, host, keep_mask=s.compiled is not None)
            rows = tasks.row_loss(s.task, logits, batch["labels"], s.loss_weights)
            # Sum over this rank's rows / rows in the global batch; DDP averages gradients over
            # ranks, so x world makes the gradient that of the whole global batch's mean loss.
            loss = (rows * batch["weights"]).sum() * s.world / step.global_rows
            s.scaler.scale(loss).backward()
        loss_sum += loss.detach()
    meter.count(rows_n, real, padded)  # once the step went through: a redone step counts once
    return loss_sum


def train_step(s: Setup, step: Step, batches: Iterator[dict], meter: StepMeter,
               lengths: np.ndarray, gather: Callable[[np.ndarray], dict] | None = None
               ) -> StepResult:
    """One optimizer step over this rank's micro-batches of `step`. Given `gather` (row indices
    -> host micro-batch), a CUDA out-of-memory error halves the token budget and redoes the
    step cut finer (autobatch.redo; one worker only): the update is the one the smaller budget
    would have made from the start, up to dropout's random masks."""
    while True:
        try:
            loss_sum = accumulate(s, step, batches, meter, lengths)
            break
        except torch.OutOfMemoryError:
            if gather is None:
                raise
        step, batches = autobatch.redo(s, step, batches, lengths, gather)
    with meter.computing():
        s.scaler.unscale_(s.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(),
                                                   s.max_grad_norm or float("inf"))
        scale = s.scaler.get_scale() if s.scaler.is_enabled() else 0.0  # fp16 only (syncs anyway)
        s.scaler.step(s.optimizer)
        s.scaler.update()
        s.optimizer.zero_grad(set_to_none=True)
        s.scheduler.step()
    skipped = float(s.scaler.is_enabled() and s.scaler.get_scale() < scale)  # overflow: skipped
    # torch.full, not torch.tensor: a host scalar copied to the GPU waits for the stream (a sync
    # per step); a fill kernel does not.
    return StepResult(loss_sum, grad_norm.detach().float(),
                      torch.full((), skipped, device=s.device))


def budget_facts(s: Setup) -> dict:
    """The token budget in use and how it came about, for every report (a halving changes it)."""
    note = s.budget_note + (f"; halved {s.halvings}x after CUDA out-of-memory errors"
                            if s.halvings else "")
    return {"micro_batch_tokens": s.spec.micro_tokens, "micro_batch_tokens_source": note,
            "compiled": s.compiled is not None}


def count_bad(bad: int, losses: list[float]) -> int:
    """Consecutive non-finite losses up to the last of `losses`, continuing from `bad`."""
    for loss in losses:
        bad = bad + 1 if not math.isfinite(loss) else 0
    return bad


def evaluate_split(s: Setup, data: TokenFile, rank: int, pad_id: int, k: int) -> dict[str, float]:
    """The task's validation figures over all ranks (each takes every world_size-th sorted
    batch; their sums meet in one all-reduce)."""
    s.model.eval()
    totals = None
    with torch.no_grad():
        for idx in eval_batches(data.lengths, s.spec, rank):
            host = data.gather(idx, pad_id, s.spec.pad_multiple)
            batch = dev.to_device(host, s.device)
            with dev.autocast(s.device, s.precision):
                logits = dev.forward(s.model, batch, host)
            sums = tasks.val_stats(s.task, logits, batch["labels"])
            totals = sums if totals is None else totals + sums
    if totals is None:  # a rank with no validation batch still joins the all-reduce
        totals = tasks.val_stats(s.task, torch.zeros((0, k), device=s.device),
                                 torch.zeros((0,) + data.labels.shape[1:], device=s.device,
                                             dtype=torch.long if data.labels.ndim == 1
                                             else torch.float32))
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)
    s.model.train()
    return tasks.val_metrics(s.task, totals.tolist(), k)


@contextlib.contextmanager
def profiler(window: tuple[int, int] | None, done: int, place: Place, out: Path):
    """torch.profiler over optimizer steps [first, last] (1-based) on rank 0, windowed by
    torch.profiler.schedule; the loop calls `.step()` after each optimizer step. Writes a
    Chrome/Perfetto trace and the top-operators table into `out`. `done` steps ran before a
    resume; a window already behind them is not profiled."""
    if not window or place.rank != 0 or window[1] <= done:
        yield None
        return
    first, last = max(window[0], done + 1), window[1]
    acts = [torch.profiler.ProfilerActivity.CPU]
    if place.device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    sort = "self_cuda_time_total" if place.device.type == "cuda" else "self_cpu_time_total"

    def ready(prof):
        prof.export_chrome_trace(str(out / f"trace_steps_{first}-{last}.json"))
        (out / "top_operators.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=30))

    skip = first - 1 - done  # profiler step k covers optimizer step done + k + 1
    schedule = torch.profiler.schedule(wait=max(skip - 1, 0), warmup=min(skip, 1),
                                       active=last - first + 1, repeat=1)
    with torch.profiler.profile(activities=acts, record_shapes=True, schedule=schedule,
                                on_trace_ready=ready) as prof:
        yield prof


def close_interval(values: list[StepResult], pending: list[dict], world: int) -> None:
    """Fill the interval's step records with loss (mean over ranks: one all-reduce), grad norm
    (the same on every rank after DDP) and the skipped flag."""
    stacked = torch.stack([torch.stack(v) for v in values]).to(torch.float64)
    losses = stacked[:, 0].contiguous()
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(losses)
    for rec, loss, norm, skip in zip(pending, losses.tolist(), stacked[:, 1].tolist(),
                                     stacked[:, 2].tolist()):
        rec.update({"loss": loss / world, "grad_norm": norm, "skipped": skip})


def check_finite(bad: int, pending: list[dict], max_bad_steps: int) -> int:
    """Count consecutive non-finite losses; stop once `max_bad_steps` of them (0 = never)."""
    bad = count_bad(bad, [r["loss"] for r in pending])
    if max_bad_steps and bad >= max_bad_steps:
        raise RuntimeError(f"loss was not finite for {bad} consecutive steps (up to step "
                           f"{pending[-1]['step']}); lower train.lr or use precision fp32/bf16. "
                           "The last good checkpoint is kept")
    return bad


def train(job: TrainJob, place: Place, report: Report, *, resume: Path | None = None,
          wrap: Callable = lambda model: model, stop: Callable[[], bool] | None = None) -> dict:
    """Train `job` on `place.device`; return the final training state (step, history, best...).

    `wrap` turns the model into its distributed form (Ray: prepare_model -> DDP); `resume` is a
    checkpoint directory to continue from; `stop()` asks, once per step, to checkpoint and stop
    early (a preemption signal; it must answer the same on every rank). A validation that beats
    the best so far (train.select_metric) is checkpointed when train.select is best; after
    train.early_stopping_patience validations without one the run checkpoints and ends.
    Every report carries `timing`: this attempt's seconds in setup (model load, optimizer,
    peak measurement), steps, validation, checkpoints and reports (telemetry/phases.py)."""
    started, clock = time.perf_counter(), Phases()
    cfg, device = job.train, place.device
    patience = cfg.early_stopping_patience
    train_data = TokenFile(job.tokens_dir / "train.arrow")
    val_data = TokenFile(job.tokens_dir / "validation.arrow")
    torch.manual_seed(cfg.seed)  # identical head init on every rank
    model = wrap(load_model(job.model, job.model_source, list(job.labels), job.pad_id,
                            announce=place.rank == 0, task=job.task).to(device))
    s = setup(cfg, model, len(train_data), device, place.world, job.task,
              tasks.loss_weights(job.task, cfg.class_weights, train_data.labels, list(job.labels)),
              lengths=train_data.lengths)
    if place.rank == 0 and cfg.micro_batch_tokens == "auto":
        print(f"[wellfed] micro_batch_tokens={s.spec.micro_tokens} ({s.budget_note})", flush=True)
    state = {"epoch": 0, "index": 0, "step": 0, "history": [],
             "best": selection.fresh(selection.resolve(cfg.select_metric, job.task))}
    if resume:  # a checkpoint from before best tracking has no record: start one
        state = {"best": state["best"], **checkpoint.load(resume, s)}
        if place.rank == 0:
            print(f"[wellfed] resuming from step {state['step']} of {s.steps} "
                  f"(epoch {state['epoch']}, batch {state['index']})", flush=True)
    torch.manual_seed(cfg.seed + 7919 * state["step"] + place.rank)  # dropout differs per rank
    name = dev.device_name(device)
    meter = StepMeter(device, device_peak(device, name, s.precision.name, s.precision.dtype),
                      unwrap(model).config)
    facts = {"rank": place.rank, "steps_total": s.steps, "precision": s.precision.name,
             "precision_reason": s.precision.reason, "pad_multiple": s.spec.pad_multiple,
             "device": name, "node": place.node, "peak_flops": meter.peak.flops,
             "peak_source": meter.peak.source}
    sampler = DeviceSampler(device).start()
    fed = feed(s, train_data, job.tokens_dir / "train.arrow", job.pad_id, place.rank,
               state["epoch"], state["index"], cfg.epochs, job.data.loader_workers,
               job.data.prefetch)
    gather = functools.partial(collate, train_data, pad_id=job.pad_id,
                               multiple=s.spec.pad_multiple)
    pending, values, bad = [], [], 0
    clock.add("setup", time.perf_counter() - started)
    with tempfile.TemporaryDirectory(prefix="wellfed-profile-") as traces, \
            profiler(cfg.profile_range(), state["step"], place, Path(traces)) as prof:
        for step, batches in fed:
            if state["step"] >= s.steps or (patience and state["best"]["since"] >= patience):
                break  # planned steps done, or a resume of a run that had stopped early
            with clock("steps"):
                values.append(train_step(s, step, batches, meter, train_data.lengths, gather))
            if prof:
                prof.step()
            state["step"] += 1
            state["epoch"], state["index"] = step.epoch, step.index + 1
            pending.append({"step": state["step"], "epoch": step.epoch,
                            "lr": s.scheduler.get_last_lr()[0], "rows": step.global_rows,
                            "real_tokens": step.real_tokens, "padded_tokens": step.padded_tokens})
            last = state["step"] >= s.steps
            stopping = not last and stop is not None and stop()
            do_eval = last or (not stopping and cfg.eval_every  # a stop has a deadline: no eval
                               and state["step"] % cfg.eval_every == 0)
            do_ckpt = last or stopping or (cfg.checkpoint_every
                                           and state["step"] % cfg.checkpoint_every == 0)
            if not (do_eval or do_ckpt or state["step"] % cfg.report_every == 0):
                continue
            with clock("steps"):  # on a GPU, where the queued steps are waited for
                close_interval(values, pending, place.world)
            bad = check_finite(bad, pending, cfg.max_bad_steps)
            metrics = {**facts, **budget_facts(s), "records": pending, **meter.interval(),
                       "telemetry": sampler.snapshot(), "sampler": sampler.kind}
            new_best = early = False
            if do_eval:  # figures all-reduced: every rank takes the same decisions below
                with clock("validation"):
                    metrics["val"] = evaluate_split(s, val_data, place.rank, job.pad_id,
                                                    len(job.labels))
                new_best = selection.observe(state["best"], metrics["val"], state["step"])
                early = bool(patience) and not last and state["best"]["since"] >= patience
                # A new best may become data/model, so it gets a checkpoint of its own.
                do_ckpt = do_ckpt or early or (new_best and cfg.select == "best")
            state["history"] += pending[:-1] + [dict(pending[-1], **metrics.get("val", {}))]
            saving = do_ckpt and place.rank == 0
            if do_ckpt:
                metrics[selection.RANK_KEY] = state["best"]["rank"] if new_best else 0
            with tempfile.TemporaryDirectory() as tmp:
                if saving:
                    with clock("checkpoints"):
                        checkpoint.save(Path(tmp), s, state, last or early, Path(traces))
                with clock("reports"):  # the sink copies the checkpoint into its storage here
                    report({**metrics, "timing": dict(clock.seconds)},
                           Path(tmp) if saving else None)
            pending, values = [], []
            meter.reset()
            if early and place.rank == 0:
                print(selection.stop_line(state["best"], state["step"]), flush=True)
            if stopping or early:
                break
    sampler.stop()
    return state
