"""One trial placed by Ray: on a reachable cluster, a one-worker run asks Ray for its CPUs and
its GPU, or a share of one (`ray.gpus_per_worker: 0.25` = four trials on a GPU), and runs where
Ray puts it, on the GPUs Ray gave it (Ray sets CUDA_VISIBLE_DEVICES, so the loop's cuda:0 is the
GPU it was given).

Why: `dvc queue start -j 4` runs four trials at once, and DVC assigns them no GPU: without a
cluster each trains on this machine's cuda:0. With one, Ray hands out whole or shared GPUs and
queues a trial whose resources are not free until a running one ends. A placed trial is one
Ray task running the same in-process loop: no Ray Train controller, placement group or worker
actors (~21 s of every run on Ray Train here).
"""

from __future__ import annotations

from typing import Callable

from wellfed.cluster import cluster_address, connect
from wellfed.errors import StageError
from wellfed.track import tracking
from wellfed.train.checkpoints import daemons, preemption
from wellfed.train.run import lost_node
from wellfed.train.run.mlflow_run import (derived_tags, marked_failed, marked_killed,
                                          marked_killed_on_stop)
from wellfed.train.run.preflight import wants_gpu
from wellfed.train.run.runs import (kept_while_running, latest_step, planned_steps,
                                    staged_tokens, training)

GPU = "GPU"


def request(cpus: int, gpus: float) -> dict[str, float]:
    """Ray's task options for one trial."""
    return {"num_cpus": cpus, "num_gpus": gpus}


def describe(need: dict[str, float]) -> str:
    gpus = need.get("num_gpus", 0)
    shown = "" if not gpus else (f", {gpus:g} GPU" + ("s" if gpus > 1 else "")
                                 + (" (a shared one)" if gpus < 1 else ""))
    return f"{need.get('num_cpus', 1):g} CPU{'s' if need.get('num_cpus', 1) != 1 else ''}{shown}"


def free_for(need: dict[str, float], available: dict[str, float]) -> bool:
    """Whether `available` (ray.available_resources()) holds `need` now."""
    return (available.get("CPU", 0) + 1e-9 >= need.get("num_cpus", 0)
            and available.get(GPU, 0) + 1e-9 >= need.get("num_gpus", 0))


def fits_at_all(need: dict[str, float], total: dict[str, float]) -> str:
    """"" when the cluster could ever run the trial, else one line saying what it lacks."""
    gpus = need.get("num_gpus", 0)
    if gpus and total.get(GPU, 0) < gpus:
        return (f"the trial asks Ray for {gpus:g} GPU but the cluster has {total.get(GPU, 0):g}; "
                f"set ray.gpus_per_worker to at most {total.get(GPU, 0):g} or ray.use_gpu: false")
    return ""


def where() -> str:
    """Inside the placed task: this node and the GPUs Ray gave the task."""
    import os

    import ray

    context = ray.get_runtime_context()
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return f"node {context.get_node_id()[:8]}, CUDA_VISIBLE_DEVICES={gpus or '(none)'}"


def run_placed(fn: Callable, *args, need: dict[str, float], label: str = "trial"):
    """fn(*args) in a Ray task with the resources `need`, on the cluster this process joined;
    says once when it waits in Ray's queue. The task's own exception is raised here."""
    import ray

    total = ray.cluster_resources()
    problem = fits_at_all(need, total)
    if problem:
        raise ValueError(problem)
    if not free_for(need, ray.available_resources()):
        print(f"[wellfed] {label}: waiting in Ray's queue for {describe(need)} (in use by other "
              f"trials); it starts when one ends", flush=True)
    task = ray.remote(max_retries=0, **need)(_placed)
    try:
        return ray.get(task.remote(label, fn, *args))
    except ray.exceptions.RayTaskError as err:  # the trial's own error, not Ray's wrapper
        raise err.as_instanceof_cause() from None


def _placed(label: str, fn: Callable, *args):
    print(f"[wellfed] {label}: placed by Ray on {where()}", flush=True)
    return fn(*args)


def queued() -> bool:
    """Whether this run is a queued `dvc exp run` (DVC runs those in a copy of the project at
    <project>/.dvc/tmp/exps/<name>), which `dvc queue start -j N` runs N at a time."""
    from pathlib import Path

    return "/.dvc/tmp/exps/" in Path.cwd().resolve().as_posix() + "/"


SHARED_GPUS = ("[wellfed] a queued trial on this machine's cuda:0: `dvc queue start -j N` trials "
               "all train there; to give each a GPU of its own (or a share: ray.gpus_per_worker "
               "0.25), start a Ray head once (`ray start --head`) and run the queue with "
               "RAY_ADDRESS=auto")
"""Said in-process on a GPU when the run is queued: DVC gives trials no GPU of their own."""


def placed(ray_cfg) -> bool:
    """One worker and a cluster to join (ray.in_process: auto): a placed trial, not Ray Train."""
    return (ray_cfg.in_process == "auto" and ray_cfg.num_workers == 1
            and bool(cluster_address(ray_cfg)))


def fit_placed(job, run, store, resume, ray_cfg, tokens_dir, opened, uri: str, clock):
    """One worker on a cluster: the in-process loop (train/run/local.py) in one Ray task that Ray
    places with `ray.cpus_per_worker` CPUs and `ray.gpus_per_worker` of a GPU. Stops on
    SIGTERM/Ctrl-C like a Ray Train run (the run's StopFlag actor)."""
    import ray

    with clock("ray start"), daemons.daemons_apart(local=False):  # a cluster's own daemons
        connect(ray_cfg)
    try:
        use_gpu = wants_gpu(ray_cfg)
        need = request(ray_cfg.cpus_per_worker, ray_cfg.gpus_per_worker if use_gpu else 0)
        if problem := fits_at_all(need, ray.cluster_resources()):
            raise StageError(problem)
        tokens = staged_tokens(ray_cfg, tokens_dir, run)
        with clock("mlflow run start"):
            run_id, backlog = opened(derived_tags(job, run, ray_cfg, use_gpu, "ray_task"))
        label, restarts = f"run {run.name}", 0
        while True:  # again from its last checkpoint when its node dies (train/run/lost_node.py)
            with marked_failed(uri, run_id):
                launch = store.open_launch("ray_task")
            flag = preemption.new_stop_flag()  # a new one: the last may have died with the node
            args = (job, store, launch, resume, kept_while_running(job.train), use_gpu,
                    ray_cfg.cpus_per_worker, uri, run_id, str(backlog), flag, *tokens)
            try:
                with training(run, store, launch, clock), marked_killed_on_stop(uri, run_id):
                    preemption.run_stoppable(
                        lambda: run_placed(trial, *args, need=need, label=label),
                        flag.request.remote, lambda: latest_step(store), planned_steps(job),
                        killed=marked_killed(uri, run_id))
                break
            except Exception as err:
                if not lost_node.node_lost(err):
                    raise
                restarts += 1
                resume = resend(label, restarts, ray_cfg.max_failures, store, need, uri, run_id,
                                err)
    finally:
        with clock("ray stop"):
            ray.shutdown()
    return run_id, backlog


def resend(label: str, restarts: int, max_failures: int, store, need: dict[str, float],
           uri: str, run_id: str, err: BaseException):
    """After a placed trial's node died: the checkpoint to send it again from, said in one line;
    or, restarts spent or no node left that could run it, the line that stops the stage (the
    MLflow run FAILED, its checkpoint kept)."""
    import ray

    step = latest_step(store)
    stop = None
    if max_failures != -1 and restarts > max_failures:
        stop = lost_node.placed_given_up(label, max_failures, step, err)
    elif problem := fits_at_all(need, ray.cluster_resources()):
        stop = lost_node.TrainingFailed(f"{label}: its node was lost and {problem}; the "
                                        f"checkpoint of step {step or 0} is kept")
    if stop is not None:
        import mlflow

        tracking.set_tags(uri, run_id, {lost_node.LOST_TAG: str(stop)})
        mlflow.MlflowClient(uri).set_terminated(run_id, "FAILED")
        raise stop from None
    line = lost_node.resend_line(label, restarts, max_failures, step, err)
    print(f"[wellfed] {line}", flush=True)
    tracking.set_tags(uri, run_id, {lost_node.LOST_TAG: line})
    resume, damage = store.recover()
    if damage:
        print(damage, flush=True)
    return resume


def trial(job, store, launch, resume, keep, use_gpu, threads, uri, run_id, backlog, flag,
          tokens_uri, tokens_hash):
    """Inside the placed task: the in-process loop on the GPU Ray gave it (cuda:0 under Ray's
    CUDA_VISIBLE_DEVICES; the CPU where there is no real one), reporting into the MLflow run."""
    import dataclasses
    from types import SimpleNamespace

    import torch

    from wellfed.train.outputs.callback import MlflowCallback, retries_restored
    from wellfed.train.run import local

    if tokens_uri:  # multi-node: this node's copy of the staged token files
        from wellfed.data.staging import localize

        job = dataclasses.replace(job, tokens_dir=localize(tokens_uri, tokens_hash))
    stop = preemption.StopCheck(flag)
    tracking.set_tags(uri, run_id, {"derived.placement": where()})
    with retries_restored():
        local.fit(job, store, launch, MlflowCallback(uri, run_id, backlog, background=True),
                  resume=resume, keep=keep, use_gpu=use_gpu and torch.cuda.is_available(),
                  threads=threads, stop=SimpleNamespace(is_set=stop.check))
