"""The driver: validate, connect to Ray, run the TorchTrainer, collect the final model.

`fit` reads top to bottom: check the request, plan the run (train/runs.py: name, storage,
resume), connect, open the MLflow run, run the trainer, finish (final checkpoint, backlog,
cleanup).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wellfed import cluster, tasks, tracking
from wellfed.cli import Interrupted, StageError
from wellfed.cluster import cluster_address, connect, local_token_auth
from wellfed.data import staging
from wellfed.data.shards import TokenFile
from wellfed.telemetry.phases import Phases
from wellfed.config import DataConfig, ModelConfig, RayConfig, TrainConfig
from wellfed.train import checkpoint, preemption, runs, selection

if TYPE_CHECKING:
    from ray.train import Checkpoint

    from wellfed.train.loop import TrainJob

log = logging.getLogger(__name__)


class TrainingFailed(StageError):
    """Training stopped on the workers; the message is the workers' own, in one line."""


@dataclass(frozen=True)
class Trained:
    """What `fit` hands the stage: the checkpoint to export and the run's last one."""

    chosen: Checkpoint
    """The checkpoint that becomes data/model (train.select)."""
    last: Checkpoint
    """The run's final checkpoint: its state holds the whole history."""
    best: dict
    """The best validation record (train/selection.py): metric, step, value, rank, since."""
    job: TrainJob | None
    """The run's job, to rebuild the model when `chosen` holds model.pt only."""


def worker_failure(err: Exception) -> TrainingFailed:
    """Ray's TrainingFailedError -> one line: each failed worker's own message."""
    failures = getattr(err, "worker_failures", None) or {}
    causes = [cause_line(rank, getattr(exc, "cause", None) or exc)  # Ray wraps the user exception
              for rank, exc in sorted(failures.items())]
    detail = "; ".join(causes) or str(err).strip().splitlines()[-1]
    return failed(detail, "Ray's logs under /tmp/ray/session_latest/logs")


def cause_line(rank: int, cause: BaseException) -> str:
    text = str(cause).strip().splitlines()
    return f"worker {rank}: {type(cause).__name__}: {text[-1] if text else ''}"


def failed(detail: str, traceback_at: str) -> TrainingFailed:
    return TrainingFailed(f"training failed ({detail}); the last good checkpoint is kept and a "
                          "rerun of `dvc repro` resumes from it. Full traceback: "
                          f"{traceback_at}")


def check_resources(ray_cfg: RayConfig, use_gpu: bool, nodes: list[dict] | None = None,
                    where: str = "this cluster") -> None:
    """Refuse, before Ray waits forever, a request no node set of this cluster can place;
    `nodes` (each node's resources) defaults to the connected cluster's."""
    nodes = cluster.live_nodes() if nodes is None else nodes
    fits = cluster.room(nodes, {"CPU": ray_cfg.cpus_per_worker, **({"GPU": 1} if use_gpu else {})})
    if fits >= ray_cfg.num_workers:
        return
    raise ValueError(
        f"ray.num_workers = {ray_cfg.num_workers} workers with {ray_cfg.cpus_per_worker} CPU(s)"
        f"{' and 1 GPU' if use_gpu else ''} each do not fit {where} ({cluster.described(nodes)}"
        f": room for {fits}); lower ray.num_workers or ray.cpus_per_worker, or add nodes")


def preflight(train_cfg: TrainConfig, ray_cfg: RayConfig) -> None:
    """Before Ray starts: what this machine can already tell about its own devices."""
    import torch

    from wellfed import device as dev

    if cluster_address(ray_cfg):
        return  # the workers' devices are on other machines; they check for themselves
    if ray_cfg.use_gpu == "true" and not dev.cuda_available():
        raise ValueError("ray.use_gpu is true but this machine has no CUDA GPU; set ray.use_gpu "
                         "to auto or false, or join a GPU cluster with RAY_ADDRESS")
    dev.choose_precision(train_cfg.precision,
                         torch.device("cuda", 0) if local_gpu(ray_cfg) else torch.device("cpu"))


def local_gpu(ray_cfg: RayConfig) -> bool:
    """Whether a worker on this machine uses its GPU (ray.use_gpu, and whether there is one)."""
    from wellfed import device as dev

    return ray_cfg.use_gpu == "true" or (ray_cfg.use_gpu == "auto" and dev.cuda_available())


def check_request(train_cfg: TrainConfig, ray_cfg: RayConfig) -> None:
    if train_cfg.global_batch_size < ray_cfg.num_workers:
        raise ValueError(f"train.global_batch_size ({train_cfg.global_batch_size}) is smaller than "
                         f"ray.num_workers ({ray_cfg.num_workers}); every worker needs at least "
                         "one row per step")
    preflight(train_cfg, ray_cfg)


def wants_gpu(ray_cfg: RayConfig) -> bool:
    import ray

    return (ray_cfg.use_gpu == "true" or
            (ray_cfg.use_gpu == "auto" and ray.cluster_resources().get("GPU", 0) > 0))


def in_process(ray_cfg: RayConfig) -> bool:
    """ray.in_process: auto = one worker and no cluster to join trains in this process
    (train/local.py), without Ray Train's ~21 s start and stop."""
    return (ray_cfg.in_process == "auto" and ray_cfg.num_workers == 1
            and not cluster_address(ray_cfg))


def open_run(run: runs.Run, uri: str, experiment: str, params: dict, tags: dict,
             derived: dict, storage: Path) -> tuple[str, Path]:
    """Start (or resume) the MLflow run, record it in the run file, log a backlog an interrupted
    run left, log params; return (run id, backlog path)."""
    from wellfed.train.callback import flush_backlog

    run_id = tracking.start_run(uri, experiment, run.title, run.resume_id, run.tags())
    if run.resume_id == run_id:  # the step it resumes from is rank 0's line, once training starts
        where = ("" if runs.resume_step(run.storage_uri, run.name) else
                 ": no checkpoint was registered, starting from step 0")
        print(f"[wellfed] resuming interrupted run {run.name} (MLflow run {run_id}){where}"
              f"{world_size_change(uri, run_id, derived)}", flush=True)
    runs.write_run_file(run.storage_uri, run.name, run_id, complete=False)
    storage.mkdir(parents=True, exist_ok=True)
    backlog = storage.resolve() / f".{run.name}.mlflow-backlog.jsonl"  # on the driver's node
    flush_backlog(uri, run_id, backlog)  # left by an interrupted run: log it before resuming
    tracking.log_params(uri, run_id, params, {**tags, **derived, **tracking.library_versions(),
                                              "data.tokens_sha256": run.data_hash})
    return run_id, backlog


def planned_steps(job) -> int:
    from wellfed.data.shards import TokenFile
    from wellfed.train.setup import total_steps

    return total_steps(len(TokenFile(job.tokens_dir / "train.arrow")), job.train)


def world_size_change(uri: str, run_id: str, derived: dict) -> str:
    """On a resume: say so when the worker count differs from the one the run last had, and keep
    every count the run has had in the tag `derived.world_sizes` (the tag `derived.world_size`
    becomes the latest)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    run = client.get_run(run_id).data
    world = derived["derived.world_size"]
    # A run made before derived values were tags has its first count as a param.
    sizes = (run.tags.get("derived.world_sizes") or run.tags.get("derived.world_size")
             or run.params.get("derived.world_size", ""))
    before = sizes.split(",")[-1] if sizes else ""
    if not before or before == str(world):
        return ""
    client.set_tag(run_id, "derived.world_sizes", f"{sizes},{world}")
    return (f", now on {world} worker(s) instead of {before}: the same global batch, "
            f"{derived['derived.accumulation_steps']} micro-batch(es) per worker per step")


def run_trainer(loop_config: dict, ray_cfg: RayConfig, use_gpu: bool, run: runs.Run, uri: str,
                run_id: str, backlog: Path):
    """The TorchTrainer over train_loop_per_worker, inside the MLflow run (whose system metrics
    cover the driver node); returns Ray's result."""
    import mlflow
    import ray.train
    from ray.train.torch import TorchTrainer

    from wellfed.train.callback import MlflowCallback
    from wellfed.train.worker import train_loop_per_worker

    loop_config = {**loop_config, "stop_flag": preemption.new_stop_flag()}
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=ray_cfg.num_workers, use_gpu=use_gpu,
            resources_per_worker={"CPU": ray_cfg.cpus_per_worker},
            placement_strategy=ray_cfg.placement_strategy),
        run_config=ray.train.RunConfig(
            name=run.name, storage_path=run.storage_uri,
            failure_config=ray.train.FailureConfig(max_failures=ray_cfg.max_failures),
            checkpoint_config=checkpoint_config(loop_config["job"].train.select),
            callbacks=[MlflowCallback(uri, run_id, str(backlog))],
            logging_config=ray.train.LoggingConfig(log_level="WARNING")),
    )
    mlflow.set_tracking_uri(uri)
    mlflow.system_metrics.set_system_metrics_node_id(f"driver-{os.uname().nodename}")
    with mlflow.start_run(run_id=run_id, log_system_metrics=True):
        try:
            return preemption.run_stoppable(trainer.fit, loop_config["stop_flag"].request.remote,
                                            lambda: runs.resume_step(run.storage_uri, run.name),
                                            planned_steps(loop_config["job"]))
        except ray.train.TrainingFailedError as err:
            raise worker_failure(err) from None
        except preemption.Stopped:
            mlflow.end_run("KILLED")  # resumable, not failed; a rerun sets it running again
            raise


def run_in_process(job: TrainJob, ray_cfg: RayConfig, use_gpu: bool, run: runs.Run, uri: str,
                   run_id: str, backlog: Path, storage: Path):
    """train/local.py's loop in this process, inside the MLflow run, stoppable like Ray's;
    returns what Ray's trainer.fit would (the latest and the kept best checkpoints)."""
    import mlflow

    from wellfed.train import local
    from wellfed.train.callback import MlflowCallback, retries_restored

    callback = MlflowCallback(uri, run_id, str(backlog))
    stop = threading.Event()
    mlflow.set_tracking_uri(uri)
    # No MLflow system metrics here: this process is the worker, whose own sampler already logs
    # its CPU or GPU (workers/*); they would add 8+ keys, and the UI's compare page plots the
    # first key a run logged, which would be system/.../cpu_utilization_percentage.
    with mlflow.start_run(run_id=run_id, log_system_metrics=False), retries_restored():
        try:
            store = local.Store(run.storage_uri, run.name, checkpoint_config(job.train.select))
            return preemption.run_stoppable(
                lambda: local.fit(job, store, callback, use_gpu=use_gpu,
                                  threads=ray_cfg.cpus_per_worker, stop=stop),
                stop.set, lambda: runs.resume_step(run.storage_uri, run.name), planned_steps(job))
        except preemption.Stopped:
            mlflow.end_run("KILLED")  # resumable, not failed; a rerun sets it running again
            raise
        except Exception as err:  # what a Ray worker's failure says, the traceback kept
            kept = local.keep_traceback(err, storage.resolve() / run.name)
            raise failed(cause_line(0, err), str(kept) if kept else "none was kept") from None


def checkpoint_config(select: str):
    """Which checkpoints Ray keeps: the latest (to resume) and, with select: best, the best.

    best: Ray 2.60 ranks checkpoints by the reported `select_rank` (the k-th new best has rank
    k, any other checkpoint 0; train/selection.py), keeps the top `num_to_keep` = 1 and never
    deletes the latest registered one (checkpoint_manager.py: `worst_results -
    {self._latest_checkpoint_result}`), so at most 2 stay: the best and the latest, the one a
    resume starts from. The rank is an integer decided by the loop: Ray never compares the
    floats itself (a tie would keep the later checkpoint; NaN sorts below -inf) and nothing
    non-finite goes into its JSON snapshot. tests/train/test_selection.py pins the
    latest-is-kept behaviour. last: the two most recent, as before."""
    import ray.train

    if select == "best":
        return ray.train.CheckpointConfig(num_to_keep=1,
                                          checkpoint_score_attribute=selection.RANK_KEY,
                                          checkpoint_score_order="max")
    return ray.train.CheckpointConfig(num_to_keep=2)


def stored_state(ckpt) -> dict:
    """A Ray checkpoint's train_state.json, read in place (shared storage: no download of the
    weights)."""
    with ckpt.filesystem.open_input_stream(f"{ckpt.path}/{checkpoint.STATE}") as f:
        return json.loads(f.read())


def choose(result, job) -> Trained:
    """The checkpoint `train.select` names: the last, or the one at the best step (the loop's
    record in the last state decides; Ray only kept it)."""
    last = result.checkpoint
    state = stored_state(last)
    best = state.get("best") or selection.fresh(selection.resolve(job.train.select_metric,
                                                                  job.task))
    if job.train.select == "last" or best["step"] in (0, state["step"]):
        return Trained(last, last, best, job)
    for ckpt, _ in result.best_checkpoints:
        if stored_state(ckpt)["step"] == best["step"]:
            return Trained(ckpt, last, best, job)
    print(f"[wellfed] WARNING: no checkpoint of the best step {best['step']} is left; exporting "
          f"the last one (step {state['step']})", flush=True)
    return Trained(last, last, best, job)


def announce(trained: Trained, uri: str, run_id: str) -> None:
    """Say which step became the model and log the best validation to MLflow as
    `best/<metric>` (e.g. best/val/macro_f1; its step is the stage's `train/best_step`)."""
    best, step = trained.best, stored_state(trained.chosen)["step"]
    total = stored_state(trained.last)["step"]
    if best["value"] is None:
        print(f"[wellfed] model: step {step} of {total}, the last (no validation gave a finite "
              f"{best['metric']})", flush=True)
        return
    tracking.log_metrics(uri, run_id, {f"best/{best['metric']}": best["value"]})
    found = f"{best['metric']} {best['value']:.4f}"
    print(f"[wellfed] model: step {step} of {total}, " +
          (f"the best {found} (train.select: {trained.job.train.select})" if step == best["step"]
           else f"the last (train.select: last); the best was {found} at step {best['step']}"),
          flush=True)


def finish(result, run: runs.Run, uri: str, run_id: str, backlog: Path, keep: str) -> None:
    """After training: a final checkpoint must exist, held-back metrics are logged, superseded
    and orphaned checkpoints go (the last and `keep`, the one to export, stay)."""
    from wellfed.train.callback import flush_backlog

    if result.checkpoint is None:
        raise StageError(f"training finished without a checkpoint; see {run.storage_uri}/{run.name}")
    try:
        if flushed := flush_backlog(uri, run_id, backlog):
            print(f"[wellfed] logged {flushed} metric values held back while MLflow was down")
    except Exception as err:
        raise StageError(f"MLflow at {uri} is still unreachable ({err}); training finished and "
                         f"its metrics wait in {backlog}: rerun `dvc repro` once the tracking "
                         "server is back to log them and finish the stage") from None
    removed = runs.remove_orphans(run.storage_uri, run.name, result.checkpoint.path, keep)
    if removed:
        print(f"[wellfed] removed {removed} superseded or orphaned checkpoint dir(s)", flush=True)


def derived_tags(job: TrainJob, run: runs.Run, ray_cfg: RayConfig, use_gpu: bool,
                   engine: str) -> dict:
    """What the driver decided, logged as `derived.*` run tags (no one set them: they are not
    params); the console says each choice as it is made."""
    return {"derived.world_size": ray_cfg.num_workers, "derived.use_gpu": use_gpu,
            "derived.accumulation_steps": job.train.accumulation_steps(ray_cfg.num_workers),
            "derived.model_source": job.model_source, "derived.run_name": run.name,
            "derived.storage": run.storage_uri, "derived.engine": engine}


def interrupted(run: runs.Run) -> Interrupted:
    step = runs.resume_step(run.storage_uri, run.name)
    kept = f"the checkpoint of step {step} is kept" if step else "no checkpoint yet"
    return Interrupted(f"training stopped by Ctrl-C ({kept}): rerun `dvc repro` to resume "
                       f"run {run.name} from there, into the same MLflow run")


def fit_in_process(job: TrainJob, run: runs.Run, ray_cfg: RayConfig, uri: str, experiment: str,
                   params: dict, tags: dict, storage: Path, clock: Phases):
    """One local worker: the loop in this process (train/local.py); no Ray is started."""
    from wellfed import device as dev

    use_gpu = local_gpu(ray_cfg)
    check_resources(ray_cfg, use_gpu, [{"CPU": os.cpu_count() or 1, "GPU": dev.gpu_count()}],
                    "this machine")
    log.info("in process: 1 worker on %s with %d thread(s), no Ray started (ray.in_process: "
             "auto; a cluster or more workers run on Ray Train)", "cuda:0" if use_gpu else "cpu",
             ray_cfg.cpus_per_worker)
    with clock("mlflow run start"):  # MLflow's and Ray's imports, its store, params
        run_id, backlog = open_run(run, uri, experiment, params, tags,
                                   derived_tags(job, run, ray_cfg, use_gpu, "in_process"),
                                   storage)
    try:
        with clock("train"):
            result = run_in_process(job, ray_cfg, use_gpu, run, uri, run_id, backlog, storage)
    except KeyboardInterrupt:
        raise interrupted(run) from None
    return result, run_id, backlog


def fit_on_ray(job: TrainJob, run: runs.Run, ray_cfg: RayConfig, tokens_dir: Path, uri: str,
               experiment: str, params: dict, tags: dict, storage: Path,
               clock: Phases):
    """Ray Train: connect (or start a local Ray), run the TorchTrainer, stop Ray."""
    import ray

    loop_config = {"job": job, "threads": ray_cfg.cpus_per_worker}
    with clock("ray start"), preemption.daemons_apart():  # a signal to dvc's group spares them
        connect(ray_cfg)
    try:
        use_gpu = wants_gpu(ray_cfg)
        check_resources(ray_cfg, use_gpu)
        if ray_cfg.storage_path:  # shared storage: every node reads the tokens from there
            loop_config["tokens_uri"], sent = staging.upload(tokens_dir, run.storage_uri,
                                                             run.data_hash)
            loop_config["tokens_hash"] = run.data_hash
            print(f"[wellfed] token files {'uploaded to' if sent else 'already at'} "
                  f"{loop_config['tokens_uri']}", flush=True)
        with clock("mlflow run start"):
            run_id, backlog = open_run(run, uri, experiment, params, tags,
                                       derived_tags(job, run, ray_cfg, use_gpu, "ray_train"),
                                       storage)
        try:
            with clock("train"):
                result = run_trainer(loop_config, ray_cfg, use_gpu, run, uri, run_id, backlog)
        except KeyboardInterrupt:
            raise interrupted(run) from None
    finally:
        with clock("ray stop"):
            ray.shutdown()
    return result, run_id, backlog


def fit(*, tokens_dir: Path, model_source: str, labels: list[str], pad_id: int, task: str,
        model_cfg: ModelConfig, train_cfg: TrainConfig, data_cfg: DataConfig, ray_cfg: RayConfig,
        storage: Path, uri: str, experiment: str, params: dict, tags: dict,
        clock: Phases | None = None) -> tuple[Trained, str, dict]:
    """Train, in this process (one local worker) or on Ray Train; return (the checkpoints to
    export, MLflow run id, run info). `clock` gets the seconds of the MLflow run's start, of
    training and, on Ray, of Ray's start and stop."""
    clock = clock or Phases()
    local_token_auth(ray_cfg)
    from wellfed.train.loop import TrainJob

    check_request(train_cfg, ray_cfg)
    run = runs.plan(tokens_dir, train_cfg, model_cfg,
                    ray_cfg.storage_path or str(storage.resolve()))
    job = TrainJob(train=train_cfg, data=data_cfg, model=model_cfg, tokens_dir=tokens_dir.resolve(),
                   model_source=model_source, labels=tuple(labels), pad_id=pad_id, task=task)
    # Before Ray starts: a class weight naming no label is a params mistake, said in one line.
    tasks.loss_weights(task, train_cfg.class_weights,
                       TokenFile(tokens_dir / "train.arrow").labels, list(labels))
    selection.resolve(train_cfg.select_metric, task)  # a figure this task has, in one line
    if in_process(ray_cfg):
        result, run_id, backlog = fit_in_process(job, run, ray_cfg, uri, experiment, params,
                                                 tags, storage, clock)
    else:
        result, run_id, backlog = fit_on_ray(job, run, ray_cfg, tokens_dir, uri, experiment,
                                             params, tags, storage, clock)
    trained = choose(result, job)
    finish(result, run, uri, run_id, backlog, trained.chosen.path)
    (storage.resolve() / run.name / runs.TRACEBACK).unlink(missing_ok=True)  # a failure's, resumed
    announce(trained, uri, run_id)
    return trained, run_id, run.info()


def write_hf(ckpt: Path, job, out: Path) -> None:
    """A checkpoint without hf_model/ (not the final one) -> HF model directory: the model is
    rebuilt as the workers built it and given the checkpoint's weights (on this CPU, fp32)."""
    import torch

    from wellfed.model import load_model

    model = load_model(job.model, job.model_source, list(job.labels), job.pad_id, task=job.task)
    model.load_state_dict(torch.load(ckpt / checkpoint.MODEL, map_location="cpu",
                                     weights_only=True))
    checkpoint.save_hf(model, out)


def export_model(trained, tokens_dir: Path, model_out: Path, uri: str, run_id: str) -> list[dict]:
    """The chosen checkpoint -> HF model directory (weights + tokenizer + label names); return
    the per-step history (the last checkpoint's). `trained` is `fit`'s Trained, or one final
    ray.train.Checkpoint. A profiler trace in the last checkpoint goes to MLflow under
    `profile/`."""
    from wellfed.outputs import atomic_path

    if not isinstance(trained, Trained):
        trained = Trained(trained, trained, {}, None)
    with trained.chosen.as_directory() as chosen, atomic_path(model_out, is_dir=True) as tmp:
        if (Path(chosen) / checkpoint.HF_MODEL).is_dir():
            shutil.copytree(Path(chosen) / checkpoint.HF_MODEL, tmp, dirs_exist_ok=True)
        else:
            write_hf(Path(chosen), trained.job, tmp)
        shutil.copytree(tokens_dir / "tokenizer", tmp, dirs_exist_ok=True)
    with trained.last.as_directory() as ckpt:
        ckpt = Path(ckpt)
        state = checkpoint.read_state(ckpt)
        if (ckpt / checkpoint.PROFILE).is_dir():
            tracking.log_artifacts(uri, run_id, ckpt / checkpoint.PROFILE, checkpoint.PROFILE)
            print(f"[wellfed] profiler trace + top operators logged to MLflow run {run_id} "
                  "under profile/ (open the trace in https://ui.perfetto.dev)")
    return state["history"]


def summarize(history: list[dict], seconds: float, figures, best: dict | None = None) -> dict:
    """The train stage's headline figures, under the names MLflow shows them by: the last
    validation (`val/*`, whose latest MLflow value is the same number), the step of the best
    one (`train/best_step`, from the `best` record), the stage's training wall time and rows,
    and the run's means over report intervals from the diagnosis `figures` (a `RunFigures`).
    Aggregations: docs/compare.md, "Headline metrics"."""
    evals = [h for h in history if "val/loss" in h]
    out = {k: v for k, v in evals[-1].items() if k.startswith("val/")} if evals else {}
    if best and best.get("step"):
        out["train/best_step"] = best["step"]
    return {**out, "train/seconds": round(seconds, 1),
            "train/rows": int(sum(h["rows"] for h in history)),
            "train/real_tokens_per_s": figures.real_tokens_per_s,
            "train/padding_efficiency": figures.padding_efficiency,
            "train/input_wait_share": figures.input_wait_share, "train/mfu": figures.mfu}


def write_history(history: list[dict], perf: list[dict], directory: Path) -> None:
    """CSV files that `dvc plots show` draws: per-step loss/lr, validation points, and the
    throughput curve `perf` (tracking.metric_table of tracking.PERF_CURVE: MLflow's own figures
    under MLflow's names)."""
    import pandas as pd

    from wellfed.outputs import atomic_path

    frame = pd.DataFrame(history)
    with atomic_path(directory, is_dir=True) as tmp:
        frame[["step", "loss", "lr", "grad_norm"]].to_csv(tmp / "steps.csv", index=False)
        pd.DataFrame(perf).to_csv(tmp / "perf.csv", index=False)
        if "val/loss" in frame:  # the task's figures: val_accuracy, val_macro_f1, val_pearson...
            keys = [k for k in frame if k.startswith("val/")]
            val = frame.dropna(subset=["val/loss"])[["step", *keys]]
            val.rename(columns={k: k.replace("/", "_") for k in keys}).to_csv(
                tmp / "validation.csv", index=False)


def write_reports(history: list[dict], uri: str, run_id: str, out: Path, data_cfg: DataConfig,
                  train_cfg: TrainConfig):
    """The train stage's reports under `out` (history/*.csv, plots/, diagnosis.md/.json), the
    plots and the diagnosis also in the MLflow run; return (the diagnosis text, its figures)."""
    from wellfed.outputs import atomic_path, write_json
    from wellfed.telemetry import diagnosis, plots

    write_history(history, tracking.metric_table(uri, run_id, tracking.PERF_CURVE),
                  out / "history")
    with atomic_path(out / "plots", is_dir=True) as tmp:
        plots.plot_history(out / "history", tmp)
    tracking.log_artifacts(uri, run_id, out / "plots", "plots")
    figures = diagnosis.figures_from_history(
        tracking.metric_histories(uri, run_id, ("workers/", "worker")),
        data_cfg.loader_workers, train_cfg.micro_batch_size)
    text, diag = diagnosis.report(figures)
    with atomic_path(out / "diagnosis.md") as tmp:
        tmp.write_text(text, encoding="utf-8")
    write_json(out / "diagnosis.json", diag)
    tracking.log_text(uri, run_id, text, "diagnosis.md")
    return text, figures
