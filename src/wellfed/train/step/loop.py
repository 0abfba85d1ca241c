"""The training loop: `train` runs in-process on one device (tests, benchmarks, a debugger) and,
unchanged, on every Ray Train worker (train/run/worker.py adapts Ray's context to it).

`setup` (train/step/setup.py) builds the model's optimizer, schedule, scaler, batch plan and step
path the same way for all of them (the micro-batch token budget: train/step/autobatch.py; the GPU's
shape plan and CUDA graphs: data/shapes.py, train/step/graphs.py); `train_step` (train/step/step.py)
is one optimizer step, `feed` (train/step/feeding.py) brings its micro-batches. Every copy of the
loop reports every `report_every` steps through the `report` function it was given (never every
step: under Ray each report can wait on the controller's 2 s poll); the sinks decide what lands
where. Losses and token counts stay on the device between reports and cross to the host once per
report.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from wellfed import device as dev
from wellfed import tasks
from wellfed.config import DataConfig, ModelConfig, TrainConfig
from wellfed.data.batching import collate
from wellfed.data.token_files import TokenFile
from wellfed.model import load_model
from wellfed.telemetry.gpu import DeviceSampler
from wellfed.telemetry.meter import StepMeter
from wellfed.telemetry.peak import device_peak
from wellfed.telemetry.phases import Phases
from wellfed.train.checkpoints import checkpoint, random_state
from wellfed.train.checkpoints.checkpoint import unwrap
from wellfed.train.checkpoints.state import TrainState
from wellfed.train.step import graphs, selection
from wellfed.train.step.feeding import feed
from wellfed.train.step.setup import learning_rate, run_facts, setup
from wellfed.train.step.step import StepResult, train_step
from wellfed.train.step.validation import evaluate_split
from wellfed.train.step.worker_report import WorkerFacts, WorkerReport

Report = Callable[[dict, "Path | None"], None]
"""report(metrics, checkpoint_dir or None): called on every rank with WorkerReport.as_dict()
(train/step/worker_report.py); under Ray, ray.train.report."""


@dataclass(frozen=True)
class TrainJob:
    """What defines one training run, the same on every worker: typed params and token files."""

    train: TrainConfig
    data: DataConfig
    model: ModelConfig
    tokens_dir: Path
    """Folder holding train.arrow and validation.arrow (this node's copy)."""
    model_source: str
    """Packaged default, local directory or Hub id, resolved on the driver's machine
    (`wellfed.model.resolve_source` of the model.name that data/tokens/meta.json keeps)."""
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


def count_bad(bad: int, losses: list[float]) -> int:
    """Consecutive non-finite losses up to the last of `losses`, continuing from `bad`."""
    for loss in losses:
        bad = bad + 1 if not math.isfinite(loss) else 0
    return bad


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


@contextlib.contextmanager
def sampling(device: torch.device):
    """The device's sampler (telemetry/gpu.py) for the loop's span, stopped however the loop
    ends: a search trial that its scheduler stops leaves through an exception, and the warm
    process it ran in trains the next trial."""
    sampler = DeviceSampler(device).start()
    try:
        yield sampler
    finally:
        sampler.stop()


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
          wrap: Callable = lambda model: model,
          stop: Callable[[], bool] | None = None,
          scratch: Callable = tempfile.TemporaryDirectory,
          validate_at: frozenset[int] | None = None, checkpoints: bool = True) -> TrainState:
    """Train `job` on `place.device`; return the final training state (step, history, best...).

    `wrap` turns the model into its distributed form (Ray: prepare_model -> DDP); `resume` is a
    checkpoint directory to continue from; `stop()` asks, once per step, to checkpoint and stop
    early (a preemption signal; it must answer the same on every rank). A validation that beats
    the best so far (train.select_metric) is checkpointed when train.select is best; after
    train.early_stopping_patience validations without one the run checkpoints and ends.
    A search trial (wellfed/search/trial.py) validates at `validate_at` (its rungs) instead of
    every train.eval_every steps, and with `checkpoints` False writes none: each validation's
    report then carries its logits (`val_logits`, one worker), what the trial keeps instead.
    Every report carries `timing`: this attempt's seconds in setup (model load, optimizer,
    peak measurement), steps, validation, checkpoints and reports (telemetry/phases.py)."""
    started, clock = time.perf_counter(), Phases()
    cfg, device = job.train, place.device
    patience = cfg.early_stopping_patience
    train_data = TokenFile(job.tokens_dir / "train.arrow")
    val_data = TokenFile(job.tokens_dir / "validation.arrow")
    torch.manual_seed(cfg.seed)  # identical head init on every rank
    model = load_model(job.model, job.model_source, list(job.labels), job.pad_id,
                       announce=place.rank == 0, task=job.task).to(device)
    if graphs.choose(cfg, device, place.world)[0] == "dynamic":
        model = wrap(model)  # the planned step all-reduces its own gradients: no DDP there
    s = setup(cfg, model, len(train_data), device, place.world, job.task,
              tasks.loss_weights(job.task, cfg.class_weights, train_data.labels, list(job.labels)),
              lengths=train_data.lengths)
    if place.rank == 0 and cfg.micro_batch_tokens == "auto":
        print(f"[wellfed] micro_batch_tokens={s.spec.micro_tokens} ({s.budget_note})", flush=True)
    if place.rank == 0 and (s.graphs is not None or device.type == "cuda"):
        print(f"[wellfed] step: {run_facts(s)['derived']['step_path']} ({s.path_note})",
              flush=True)
    metric = selection.resolve(cfg.select_metric, job.task)
    state, saved = TrainState(best=selection.fresh(metric)), None

    def finished(st: TrainState) -> bool:
        return st.step >= s.steps or (bool(patience) and st.best.since >= patience)

    if resume:  # a checkpoint from before best tracking has no record: it gets a fresh one
        state, saved = checkpoint.load(resume, s, metric, finished=finished)
        if s.graphs is not None:  # the loaded optimizer holds host learning rates again
            graphs.use_device_lr(s.optimizer, device)
        if place.rank == 0:
            print(f"[wellfed] resuming from step {state.step} of {s.steps} "
                  f"(epoch {state.epoch}, batch {state.index})", flush=True)
    # Dropout's generators, per rank: seeded at a fresh start, put back at a resume, so a stopped
    # run draws the masks the uninterrupted one would have (train/checkpoints/random_state.py).
    if not resume:
        random_state.seed(cfg.seed, place.rank)
    elif reseeded := random_state.restore(saved, device, place.rank, place.world, cfg.seed,
                                          state.step):
        if place.rank == 0 and not finished(state):
            print(random_state.reseeded_line(reseeded, state.step), flush=True)
    name = dev.device_name(device)
    meter = StepMeter(device, device_peak(device, name, s.precision.name, s.precision.dtype),
                      unwrap(model).config)
    facts = WorkerFacts(place.rank, s.steps, s.precision.name, s.precision.reason,
                        s.spec.pad_multiple, name, place.node, meter.peak.flops,
                        meter.peak.source)
    fed = feed(s, train_data, job.tokens_dir / "train.arrow", job.pad_id, place.rank,
               state.epoch, state.index, cfg.epochs, job.data.loader_workers,
               job.data.prefetch)
    def gather(idx):  # an out-of-memory redo re-cuts a step: shaped by the spec then in use
        return collate(train_data, idx, job.pad_id, s.spec)

    pending, values, bad = [], [], 0
    clock.add("setup", time.perf_counter() - started)
    with sampling(device) as sampler, \
            tempfile.TemporaryDirectory(prefix="wellfed-profile-") as traces, \
            profiler(cfg.profile_range(), state.step, place, Path(traces)) as prof:
        for step, batches in fed:
            if state.step >= s.steps or (patience and state.best.since >= patience):
                break  # planned steps done, or a resume of a run that had stopped early
            with clock("steps"):
                values.append(train_step(s, step, batches, meter, train_data.lengths, gather))
            if prof:
                prof.step()
            state.step += 1
            state.epoch, state.index = step.epoch, step.index + 1
            pending.append({"step": state.step, "epoch": step.epoch,
                            "lr": learning_rate(s), "rows": step.global_rows,
                            "real_tokens": step.real_tokens, "padded_tokens": step.padded_tokens})
            last = state.step >= s.steps
            stopping = not last and stop is not None and stop()
            due = (state.step in validate_at if validate_at is not None else
                   cfg.eval_every and state.step % cfg.eval_every == 0)
            # A stop on a step due to validate validates first, as the uninterrupted run does
            # there: skipped, that validation would be lost for good and early stopping and
            # `select: best` would decide on other figures (its time counts against the stop's).
            do_eval = last or due
            do_ckpt = checkpoints and (last or stopping or (
                cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0))
            if not (do_eval or do_ckpt or state.step % cfg.report_every == 0):
                continue
            with clock("steps"):  # on a GPU, where the queued steps are waited for
                close_interval(values, pending, place.world)
            bad = check_finite(bad, pending, cfg.max_bad_steps)
            interval, telemetry = meter.interval(), sampler.snapshot()
            val, new_best, early, logits = None, False, False, None
            if do_eval:  # figures all-reduced: every rank takes the same decisions below
                with clock("validation"):
                    val, logits = evaluate_split(s, val_data, place.rank, job.pad_id,
                                                 len(job.labels), keep_logits=place.world == 1)
                new_best = selection.observe(state.best, val, state.step)
                early = bool(patience) and not last and state.best.since >= patience
                # A new best may become data/model, so it gets a checkpoint of its own.
                do_ckpt = checkpoints and (do_ckpt or early or (new_best and cfg.select == "best"))
            state.history += pending[:-1] + [dict(pending[-1], **(val or {}))]
            # Every rank's generators, for a checkpoint a run may go on from (a collective).
            rng = random_state.gather(device) if do_ckpt and not (last or early) else None
            saving = do_ckpt and place.rank == 0
            with (scratch() if saving else contextlib.nullcontext()) as tmp:
                if saving:
                    with clock("checkpoints"):
                        checkpoint.save(Path(tmp), s, state, last or early, Path(traces),
                                        logits, rng)
                with clock("reports"):  # the sink copies the checkpoint into its storage here
                    sent = WorkerReport(facts, run_facts(s), pending, interval, telemetry,
                                        sampler.kind, dict(clock.seconds), val,
                                        (state.best.rank if new_best else 0) if do_ckpt
                                        else None).as_dict()
                    if not checkpoints and logits is not None:
                        sent["val_logits"] = logits
                    report(sent, Path(tmp) if saving else None)
            pending, values = [], []
            meter.reset()
            if early and place.rank == 0:
                print(selection.stop_line(state.best, state.step), flush=True)
            if stopping or early:
                break
    if place.rank == 0 and s.graphs is not None and s.graphs.capture:
        g = s.graphs
        print(f"[wellfed] CUDA graphs: {len(g.micro)} shapes and the update captured in "
              f"{g.capture_s:.1f} s; {g.replays} micro-batches replayed, {g.eager} eager "
              "(each shape's first, its warm-up)", flush=True)
    return state
