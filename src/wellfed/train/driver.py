"""The driver: validate, connect to Ray, run the TorchTrainer, collect the final model.

Resuming is deliberate: Ray resumes any run whose storage path and name are reused, so the name
is a hash of everything that defines the run (params, model, token files). Unchanged inputs after
an interrupted run → resume from its last checkpoint into the same MLflow run; changed inputs →
a new name, a fresh start. A completed run's directory is cleared before a forced re-run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from wellfed import tracking
from wellfed.config import DataConfig, ModelConfig, RayConfig, TrainConfig

log = logging.getLogger(__name__)
RUN_FILE = "wellfed_run.json"


def file_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def run_name(train: TrainConfig, model: ModelConfig, ray_cfg: RayConfig, data_hash: str) -> str:
    key = json.dumps([asdict(train), asdict(model), ray_cfg.num_workers, data_hash], sort_keys=True)
    return "wf-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def check_resources(ray_cfg: RayConfig, use_gpu: bool) -> None:
    import ray

    res = ray.cluster_resources()
    cpus, gpus = res.get("CPU", 0), res.get("GPU", 0)
    need = ray_cfg.num_workers * ray_cfg.cpus_per_worker
    problems = []
    if need > cpus:
        problems.append(f"ray.num_workers x ray.cpus_per_worker = {need} CPUs but the cluster has "
                        f"{cpus:g}; lower ray.num_workers or ray.cpus_per_worker")
    if use_gpu and ray_cfg.num_workers > gpus:
        problems.append(f"ray.num_workers = {ray_cfg.num_workers} GPU workers but the cluster has "
                        f"{gpus:g} GPUs; lower ray.num_workers or set ray.use_gpu: false")
    if problems:
        raise ValueError("; ".join(problems))


def quiet_ray_logs() -> None:
    """Runs in every Ray worker process: keep the console for people, not Ray internals.

    Ray 2.60 logs every `ray.train.report` payload at INFO under a logger named after its file
    (so `LoggingConfig` does not reach it), and the placement-group cleaner warns once a second
    when the state API (the dashboard, off here) is absent. Both stay in Ray's log files.
    """
    from ray.train.v2._internal.execution import context
    from ray.train.v2._internal.execution.controller import placement_group_cleaner

    logging.getLogger(context.__file__).setLevel(logging.WARNING)
    logging.getLogger(placement_group_cleaner.__name__).setLevel(logging.ERROR)


def connect(ray_cfg: RayConfig) -> None:
    import ray

    address = ray_cfg.address or os.environ.get("RAY_ADDRESS", "")
    env = {"env_vars": {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
                        if k in os.environ} | {"TOKENIZERS_PARALLELISM": "false"},
           "worker_process_setup_hook": "wellfed.train.driver.quiet_ray_logs"}
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=True)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, runtime_env=env,
                 log_to_driver=True, logging_level=logging.WARNING)
    res = ray.cluster_resources()
    log.info("ray: %s, %d node(s), %g CPUs, %g GPUs", address or "local",
             len([n for n in ray.nodes() if n["Alive"]]), res.get("CPU", 0), res.get("GPU", 0))


def prepare_storage(storage: Path, name: str) -> tuple[Path, str | None]:
    """The run directory and, when resuming an interrupted run, its MLflow run id."""
    run_dir = storage / name
    info = run_dir / RUN_FILE
    if info.is_file():
        saved = json.loads(info.read_text())
        if not saved.get("complete"):
            return run_dir, saved.get("mlflow_run_id")
    shutil.rmtree(run_dir, ignore_errors=True)  # a completed (or foreign) run: start fresh
    return run_dir, None


def fit(*, tokens_dir: Path, model_source: str, labels: list[str], pad_id: int,
        model_cfg: ModelConfig, train_cfg: TrainConfig, data_cfg: DataConfig, ray_cfg: RayConfig,
        storage: Path,
        uri: str, experiment: str, params: dict, tags: dict) -> tuple[object, str, dict]:
    """Run training on Ray; return (final checkpoint, MLflow run id, run info)."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from wellfed.train.loop import train_loop_per_worker

    if train_cfg.global_batch_size < ray_cfg.num_workers:
        raise ValueError(f"train.global_batch_size ({train_cfg.global_batch_size}) is smaller than "
                         f"ray.num_workers ({ray_cfg.num_workers}); every worker needs at least "
                         "one row per step")
    data_hash = file_digest([tokens_dir / "train.arrow", tokens_dir / "validation.arrow"])
    name = run_name(train_cfg, model_cfg, ray_cfg, data_hash)
    storage = storage.resolve()
    storage.mkdir(parents=True, exist_ok=True)
    run_dir, resume_id = prepare_storage(storage, name)
    connect(ray_cfg)
    try:
        use_gpu = (ray_cfg.use_gpu == "true" or
                   (ray_cfg.use_gpu == "auto" and ray.cluster_resources().get("GPU", 0) > 0))
        check_resources(ray_cfg, use_gpu)
        run_id = tracking.start_run(uri, experiment, name, resume_id)
        if resume_id == run_id:
            print(f"[wellfed] resuming interrupted run {name} (MLflow run {run_id})", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_FILE).write_text(json.dumps({"mlflow_run_id": run_id, "complete": False}))
        derived = {"derived.world_size": ray_cfg.num_workers, "derived.use_gpu": use_gpu,
                   "derived.accumulation_steps": train_cfg.accumulation_steps(ray_cfg.num_workers),
                   "derived.model_source": model_source, "derived.run_name": name}
        tracking.log_params(uri, run_id, {**params, **derived},
                            {**tags, **tracking.library_versions(), "data.tokens_sha256": data_hash})
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"train": asdict(train_cfg), "model": asdict(model_cfg),
                               "data": asdict(data_cfg),
                               "model_source": model_source, "labels": labels, "pad_id": pad_id,
                               "tokens_dir": str(tokens_dir.resolve()),
                               "threads": ray_cfg.cpus_per_worker},
            scaling_config=ray.train.ScalingConfig(
                num_workers=ray_cfg.num_workers, use_gpu=use_gpu,
                resources_per_worker={"CPU": ray_cfg.cpus_per_worker}),
            run_config=ray.train.RunConfig(
                name=name, storage_path=str(storage),
                failure_config=ray.train.FailureConfig(max_failures=ray_cfg.max_failures),
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
                callbacks=[tracking.MlflowCallback(uri, run_id)],
                logging_config=ray.train.LoggingConfig(log_level="WARNING")),
        )
        import mlflow

        # MLflow's own system metrics (CPU, memory, GPU) for the driver node, into the same run.
        mlflow.set_tracking_uri(uri)
        mlflow.system_metrics.set_system_metrics_node_id(f"driver-{os.uname().nodename}")
        with mlflow.start_run(run_id=run_id, log_system_metrics=True):
            result = trainer.fit()
    finally:
        ray.shutdown()
    if result.checkpoint is None:
        raise RuntimeError(f"training finished without a checkpoint; see the logs in {run_dir}")
    return result.checkpoint, run_id, {"run_dir": run_dir, "name": name}


def mark_complete(run_dir: Path, run_id: str) -> None:
    (run_dir / RUN_FILE).write_text(json.dumps({"mlflow_run_id": run_id, "complete": True}))


def export_model(checkpoint, tokens_dir: Path, model_out: Path, uri: str, run_id: str) -> list[dict]:
    """Final checkpoint -> HF model directory (weights + tokenizer + label names); return the
    per-step history. A profiler trace in the checkpoint goes to MLflow under `profile/`."""
    from wellfed.outputs import atomic_path

    with checkpoint.as_directory() as ckpt:
        ckpt = Path(ckpt)
        state = json.loads((ckpt / "train_state.json").read_text())
        with atomic_path(model_out, is_dir=True) as tmp:
            shutil.copytree(ckpt / "hf_model", tmp, dirs_exist_ok=True)
            shutil.copytree(tokens_dir / "tokenizer", tmp, dirs_exist_ok=True)
        if (ckpt / "profile").is_dir():
            tracking.log_artifacts(uri, run_id, ckpt / "profile", "profile")
            print(f"[wellfed] profiler trace + top operators logged to MLflow run {run_id} "
                  "under profile/ (open the trace in https://ui.perfetto.dev)")
    return state["history"]


def summarize(history: list[dict], seconds: float) -> dict:
    """Train-stage metrics from the per-step history."""
    last = history[-1]
    evals = [h for h in history if "val/accuracy" in h]
    rows = sum(h["rows"] for h in history)
    real = sum(h["real_tokens"] for h in history)
    padded = sum(h["padded_tokens"] for h in history)
    out = {"steps": last["step"], "epochs": last["epoch"] + 1, "final_loss": last["loss"],
           "train_seconds": round(seconds, 1), "rows_seen": int(rows),
           "padding_efficiency": real / padded if padded else 1.0}
    if evals:
        out.update({"val_accuracy": evals[-1]["val/accuracy"], "val_loss": evals[-1]["val/loss"]})
    return out


def write_history(history: list[dict], directory: Path) -> None:
    """CSV files that `dvc plots show` draws: per-step loss/lr and validation points."""
    import pandas as pd

    from wellfed.outputs import atomic_path

    frame = pd.DataFrame(history)
    with atomic_path(directory, is_dir=True) as tmp:
        frame[["step", "loss", "lr", "grad_norm"]].to_csv(tmp / "steps.csv", index=False)
        perf = ["samples_per_s", "real_tokens_per_s", "input_wait_share", "mfu"]
        frame.dropna(subset=perf[:1])[["step", *perf]].to_csv(tmp / "perf.csv", index=False)
        if "val/accuracy" in frame:
            val = frame.dropna(subset=["val/accuracy"])[["step", "val/accuracy", "val/loss"]]
            val.rename(columns={"val/accuracy": "val_accuracy", "val/loss": "val_loss"}).to_csv(
                tmp / "validation.csv", index=False)
