"""The Ray Train engine, driver side: connect to the cluster (or start a local Ray), run a
TorchTrainer over the workers (train/run/worker.py) inside the MLflow run, and after a lost
node go on from the last checkpoint on the workers that fit (train/run/lost_node.py)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from wellfed.cluster import cluster_address, connect
from wellfed.config import RayConfig
from wellfed.telemetry.phases import Phases
from wellfed.train.checkpoints import daemons, preemption
from wellfed.train.checkpoints.store import Entry, Store
from wellfed.train.run import failures, lost_node, runs
from wellfed.train.run.mlflow_run import derived_tags, marked_failed, marked_killed
from wellfed.train.run.preflight import check_resources, wants_gpu
from wellfed.train.run.runs import kept_while_running, latest_step, planned_steps

if TYPE_CHECKING:
    from wellfed.train.step.loop import TrainJob

POLL_ENV, POLL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2"


def run_trainer(worker, ray_cfg: RayConfig, use_gpu: bool, store: Store,
                resume: Entry | None, uri: str, run_id: str, backlog: Path) -> None:
    """The TorchTrainer over train_loop_per_worker, inside the MLflow run (whose system metrics
    cover the driver node). Ray's run folder is the launch's; the workers start from `resume`
    (what the store found good) and Ray registers every checkpoint the store writes for it."""
    import mlflow
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from wellfed.train.outputs.callback import MlflowCallback, StoreCallback
    from wellfed.train.run.ray_callback import RayCallback
    from wellfed.train.run.worker import train_loop_per_worker

    flag = preemption.new_stop_flag()
    worker = dataclasses.replace(worker, stop_flag=flag, resume=(
        ray.train.Checkpoint(resume.path, filesystem=store.fs) if resume else None))
    job = worker.job
    # A worker's ray.train.report waits until Ray Train's controller takes the one before it
    # off a queue of one, and the controller looks once per health check (2 s by default):
    # reports every few fast steps held the workers at each one (benchmarks/ray_reports.py,
    # docs/scale-out.md). Ray reads this variable on the driver and passes it to the
    # controller; a value the user set wins.
    os.environ.setdefault(POLL_ENV, POLL_S)
    per_worker = {"CPU": ray_cfg.cpus_per_worker}
    if use_gpu:  # 1 = a GPU of its own; a share lets workers of several runs share one
        per_worker["GPU"] = ray_cfg.gpus_per_worker
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config={"worker": worker},
        scaling_config=ray.train.ScalingConfig(
            num_workers=ray_cfg.num_workers, use_gpu=use_gpu, resources_per_worker=per_worker,
            placement_strategy=ray_cfg.placement_strategy),
        run_config=ray.train.RunConfig(
            name=worker.launch, storage_path=store.dir, storage_filesystem=store.fs,
            # A group Ray cannot place again (a lost node) counts apart from one that failed, and
            # Ray leaves those retries unbounded: bounded by the same knob (train/run/lost_node.py).
            failure_config=ray.train.FailureConfig(
                max_failures=ray_cfg.max_failures,
                controller_failure_limit=ray_cfg.max_failures),
            callbacks=[RayCallback(MlflowCallback(uri, run_id, str(backlog))),
                       RayCallback(StoreCallback(store, kept_while_running(job.train),
                                                 job.train.select == "best"))],
            logging_config=ray.train.LoggingConfig(log_level="WARNING")),
    )
    mlflow.set_tracking_uri(uri)
    mlflow.system_metrics.set_system_metrics_node_id(f"driver-{os.uname().nodename}")
    with mlflow.start_run(run_id=run_id, log_system_metrics=True):
        try:
            preemption.run_stoppable(trainer.fit, flag.request.remote,
                                     lambda: latest_step(store), planned_steps(job),
                                     killed=marked_killed(uri, run_id))
        except ray.train.TrainingFailedError as err:
            raise failures.worker_failure(err) from None
        except preemption.Stopped:
            mlflow.end_run("KILLED")  # resumable, not failed; a rerun sets it running again
            raise
        if line := ray.get(flag.failure.remote()):  # Ray's retry returned at once: no use
            raise failures.TrainingFailed(line)


def fit_on_ray(job: TrainJob, run: runs.Run, store: Store, resume: Entry | None,
               ray_cfg: RayConfig, tokens_dir: Path, opened, uri: str, clock: Phases):
    """Ray Train: connect (or start a local Ray), run the TorchTrainer, stop Ray."""
    import ray

    from wellfed.train.run.worker import WorkerConfig

    with clock("ray start"), daemons.daemons_apart(local=not cluster_address(ray_cfg)):
        connect(ray_cfg)  # a signal to dvc's group spares the daemons; gone with the driver
    try:
        use_gpu = wants_gpu(ray_cfg)
        check_resources(ray_cfg, use_gpu)
        tokens_uri, tokens_hash = runs.staged_tokens(ray_cfg, tokens_dir, run)
        with clock("mlflow run start"):
            run_id, backlog = opened(derived_tags(job, run, ray_cfg, use_gpu, "ray_train"))
        workers = ray_cfg  # the request; fewer after a lost node (train/run/lost_node.py)
        per_worker = {"CPU": ray_cfg.cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
        while True:
            with marked_failed(uri, run_id):
                launch = store.open_launch("ray_train")
            worker = WorkerConfig(job, ray_cfg.cpus_per_worker, store, launch,
                                  tokens_uri=tokens_uri, tokens_hash=tokens_hash)
            try:
                with runs.training(run, store, launch, clock):
                    run_trainer(worker, workers, use_gpu, store, resume, uri, run_id, backlog)
                break
            except failures.TrainingFailed as err:
                shrunk = lost_node.after_ray_train(workers, ray_cfg, per_worker, job.train,
                                                   latest_step(store), uri, run_id,
                                                   unplaced=err.unplaced)
                if shrunk is None:
                    raise  # not a lost node: the failure's own line
                workers = shrunk
                resume, damage = store.recover()
                if damage:
                    print(damage, flush=True)
    finally:
        with clock("ray stop"):
            ray.shutdown()
    return run_id, backlog
