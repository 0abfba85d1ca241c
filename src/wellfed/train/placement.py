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
