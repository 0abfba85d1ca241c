"""The driver: run training, in this process, as one placed Ray task or on Ray Train, and hand
back its checkpoints.

`fit` reads top to bottom: check the request (train/run/preflight.py), plan the run
(train/run/runs.py: name, storage, resume), find the checkpoint to resume from
(train/checkpoints/store.py), open the MLflow run (train/run/mlflow_run.py), train in a launch
folder of its own (here in process, train/run/placement.py placed, train/run/ray_train.py on
Ray Train), choose the checkpoint to export. What follows training is the stage's: export
(train/outputs/export.py), reports (train/outputs/reports.py), the model's registration, and the
run's completion (`complete`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wellfed import tasks
from wellfed.cluster import local_token_auth
from wellfed.config import DataConfig, ModelConfig, RayConfig, TrainConfig
from wellfed.data import coverage
from wellfed.data.token_files import TokenFile
from wellfed.errors import StageError
from wellfed.telemetry.phases import Phases
from wellfed.track import tracking
from wellfed.train.checkpoints import preemption, retention
from wellfed.train.checkpoints.state import Best
from wellfed.train.checkpoints.store import Entry, Store
from wellfed.train.run import failures, runs
from wellfed.train.run.mlflow_run import (derived_tags, marked_failed, marked_killed,
                                          open_run)
from wellfed.train.run.placement import SHARED_GPUS, fit_placed, placed, queued
from wellfed.train.run.preflight import (check_outputs, check_request, check_resources,
                                         in_process, local_gpu)
from wellfed.train.run.ray_train import fit_on_ray
from wellfed.train.run.runs import kept_while_running, latest_step, planned_steps
from wellfed.train.step import selection

if TYPE_CHECKING:
    from wellfed.train.step.loop import TrainJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Trained:
    """What `fit` hands the stage: the checkpoint to export and the run's last one."""

    chosen: Entry
    """The checkpoint that becomes data/model (train.select)."""
    last: Entry
    """The run's final checkpoint: its state holds the whole history."""
    best: Best
    """The best validation record (train/step/selection.py): metric, step, value, rank, since."""
    job: TrainJob
    """The run's job, to rebuild the model for model.pt's weights."""
    store: Store
    """Where both are."""


def run_in_process(job: TrainJob, ray_cfg: RayConfig, use_gpu: bool, run: runs.Run,
                   store: Store, launch: str, resume: Entry | None, uri: str, run_id: str,
                   backlog: Path, storage: Path) -> None:
    """train/run/local.py's loop in this process, inside the MLflow run, stoppable like Ray's."""
    import mlflow

    from wellfed.train.outputs.callback import MlflowCallback, retries_restored
    from wellfed.train.run import local

    callback = MlflowCallback(uri, run_id, str(backlog), background=True)
    stop = threading.Event()
    mlflow.set_tracking_uri(uri)
    # No MLflow system metrics here: this process is the worker, whose own sampler already logs
    # its CPU or GPU (workers/*); they would add 8+ keys, and the UI's compare page plots the
    # first key a run logged, which would be system/.../cpu_utilization_percentage.
    with mlflow.start_run(run_id=run_id, log_system_metrics=False), retries_restored():
        try:
            preemption.run_stoppable(
                lambda: local.fit(job, store, launch, callback, resume=resume,
                                  keep=kept_while_running(job.train), use_gpu=use_gpu,
                                  threads=ray_cfg.cpus_per_worker, stop=stop),
                stop.set, lambda: latest_step(store), planned_steps(job),
                killed=marked_killed(uri, run_id))
        except preemption.Stopped:
            mlflow.end_run("KILLED")  # resumable, not failed; a rerun sets it running again
            raise
        except Exception as err:  # what a Ray worker's failure says, the traceback kept
            kept = local.keep_traceback(err, storage.resolve() / run.name)
            raise failures.TrainingFailed(failures.message(
                0, err, str(kept) if kept else "none was kept")) from None


def choose(store: Store, job) -> Trained:
    """The checkpoint `train.select` names: the last, or the one at the best step (the loop's
    record in the last state decides; the store only kept it)."""
    found = store.entries()
    if not found:
        raise StageError(f"training finished without a checkpoint; see {store.dir}")
    last = found[-1]
    state = store.state(last)
    best = state.best if state.best.metric else selection.fresh(
        selection.resolve(job.train.select_metric, job.task))  # a state from before the record
    if job.train.select == "last" or best.step in (0, state.step):
        return Trained(last, last, best, job, store)
    for entry in reversed(found):
        if entry.step == best.step:
            return Trained(entry, last, best, job, store)
    print(f"[wellfed] WARNING: no checkpoint of the best step {best.step} is left; exporting "
          f"the last one (step {state.step})", flush=True)
    return Trained(last, last, best, job, store)


def announce(trained: Trained, uri: str, run_id: str) -> None:
    """Say which step became the model and log the best validation to MLflow as
    `best/<metric>` (e.g. best/val/macro_f1; its step is the stage's `train/best_step`)."""
    best, step, total = trained.best, trained.chosen.step, trained.last.step
    if best.value is None:
        print(f"[wellfed] model: step {step} of {total}, the last (no validation gave a finite "
              f"{best.metric})", flush=True)
        return
    tracking.log_metrics(uri, run_id, {f"best/{best.metric}": best.value})
    found = f"{best.metric} {best.value:.4f}"
    print(f"[wellfed] model: step {step} of {total}, " +
          (f"the best {found} (train.select: {trained.job.train.select})" if step == best.step
           else f"the last (train.select: last); the best was {found} at step {best.step}"),
          flush=True)


def flush(uri: str, run_id: str, backlog: Path) -> None:
    """After training: metrics held back while MLflow was down are logged now."""
    from wellfed.train.outputs.callback import flush_backlog

    try:
        if flushed := flush_backlog(uri, run_id, backlog):
            print(f"[wellfed] logged {flushed} metric values held back while MLflow was down")
    except Exception as err:
        raise StageError(f"MLflow at {uri} is still unreachable ({err}); training finished and "
                         f"its metrics wait in {backlog}: rerun `dvc repro` once the tracking "
                         "server is back to log them and finish the stage") from None


def fit_in_process(job: TrainJob, run: runs.Run, store: Store, resume: Entry | None,
                   ray_cfg: RayConfig, opened, uri: str, storage: Path, clock: Phases):
    """One local worker: the loop in this process (train/run/local.py); no Ray is started."""
    from wellfed import device as dev

    use_gpu = local_gpu(ray_cfg)
    check_resources(ray_cfg, use_gpu, [{"CPU": os.cpu_count() or 1, "GPU": dev.gpu_count()}],
                    "this machine")
    if use_gpu and queued():
        print(SHARED_GPUS, flush=True)
    log.info("in process: 1 worker on %s with %d thread(s), no Ray started (ray.in_process: "
             "auto; a cluster or more workers run on Ray Train)", "cuda:0" if use_gpu else "cpu",
             ray_cfg.cpus_per_worker)
    with clock("mlflow run start"):  # MLflow's and Ray's imports, its store, params
        run_id, backlog = opened(derived_tags(job, run, ray_cfg, use_gpu, "in_process"))
    with marked_failed(uri, run_id):
        launch = store.open_launch("in_process")
    with runs.training(run, store, launch, clock):
        run_in_process(job, ray_cfg, use_gpu, run, store, launch, resume, uri, run_id, backlog,
                       storage)
    return run_id, backlog


def fit(*, tokens_dir: Path, model_source: str, labels: list[str], pad_id: int, task: str,
        model_cfg: ModelConfig, train_cfg: TrainConfig, data_cfg: DataConfig, ray_cfg: RayConfig,
        storage: Path, uri: str, experiment: str, params: dict, tags: dict,
        clock: Phases | None = None,
        outputs: tuple[Path, Path] | None = None) -> tuple[Trained, str, dict]:
    """Train, in this process (one local worker) or on Ray Train; return (the checkpoints to
    export, MLflow run id, run info: storage, name, and `seconds_before`, the training seconds
    of the run's earlier processes). `clock` gets the seconds of the MLflow run's start, of
    training and, on Ray, of Ray's start and stop. `outputs` (the stage's model folder and
    reports folder) are checked for access and room before anything trains, with the
    checkpoint storage and a local MLflow store (train/run/preflight.py)."""
    clock = clock or Phases()
    local_token_auth(ray_cfg)
    from wellfed.train.step.loop import TrainJob

    check_request(train_cfg, ray_cfg)
    run = runs.plan(tokens_dir, train_cfg, model_cfg,
                    ray_cfg.storage_path or str(storage.resolve()),
                    params if outputs is not None else None, list(outputs or []))
    job = TrainJob(train=train_cfg, data=data_cfg, model=model_cfg, tokens_dir=tokens_dir.resolve(),
                   model_source=model_source, labels=tuple(labels), pad_id=pad_id, task=task)
    # Before Ray starts: a class weight naming no label is a params mistake, said in one line.
    tasks.loss_weights(task, train_cfg.class_weights,
                       TokenFile(tokens_dir / "train.arrow").labels, list(labels))
    selection.resolve(train_cfg.select_metric, task)  # a figure this task has, in one line
    validation = tokens_dir / "validation.arrow"  # can it pick a checkpoint: said before training
    if gap := coverage.gap("validation", task, coverage.counts(
            task, TokenFile(validation).labels, list(labels))):
        print(f"[wellfed] WARNING: {gap.warning(str(validation))}", flush=True)
    store = Store(run.storage_uri, run.name)
    if outputs is not None:
        check_outputs(job, store, outputs, tracking.local_store(uri))
    resume, damage = store.recover()
    if damage:
        print(damage, flush=True)
    before = store.seconds_before()

    def opened(derived: dict) -> tuple[str, Path]:
        return open_run(run, uri, experiment, params, tags, derived, storage, resume)

    if in_process(ray_cfg):
        run_id, backlog = fit_in_process(job, run, store, resume, ray_cfg, opened, uri, storage,
                                         clock)
    elif placed(ray_cfg):  # one worker on a cluster: one Ray task where Ray places it
        run_id, backlog = fit_placed(job, run, store, resume, ray_cfg, tokens_dir, opened, uri,
                                     clock)
    else:
        run_id, backlog = fit_on_ray(job, run, store, resume, ray_cfg, tokens_dir, opened, uri,
                                     clock)
    trained = choose(store, job)
    flush(uri, run_id, backlog)
    (storage.resolve() / run.name / runs.TRACEBACK).unlink(missing_ok=True)  # a failure's, resumed
    announce(trained, uri, run_id)
    return trained, run_id, {**run.info(), "seconds_before": before,
                             "outputs": [str(p) for p in outputs or []]}


def complete(trained: Trained, info: dict, run_id: str, uri: str, model: dict,
             model_dir: Path) -> None:
    """The stage's outputs are all written: the run is complete (a rerun starts fresh) and keeps
    only the exported checkpoint, without optimizer state, its weights linked to the MLflow model's
    files where they can be (train/checkpoints/store.py, `complete`); say what it left."""
    from wellfed import disk
    from wellfed.track import registry

    runs.mark_complete(info, run_id, model)
    exported = registry.local_files(uri, model.get("model_id"))
    try:  # housekeeping: it must not fail a stage whose outputs are all written
        removed = retention.complete(trained.store, trained.chosen, exported)
        print(f"[wellfed] checkpoints: kept {trained.store.shown(trained.chosen.path)} (step "
              f"{trained.chosen.step}, without optimizer state), removed {removed} other(s)",
              flush=True)
        run_dir = Path(trained.store.dir) if trained.store.renames else None
        print(f"[wellfed] {disk.left_behind(model_dir, exported, run_dir)}", flush=True)
    except OSError as err:
        print(f"[wellfed] WARNING: the finished run's checkpoints were not pruned ({err}); "
              f"{trained.store.dir} can be deleted", file=sys.stderr, flush=True)
