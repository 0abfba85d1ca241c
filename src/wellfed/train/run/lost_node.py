"""A node lost while training: bounded restarts, then the workers that fit, or one line.

Ray Train restarts a worker group whose node died from the last checkpoint. On a cluster
without room for the group again (no replacement node joins), each start waits Ray's start
timeout (RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, 60 s), and Ray 2.60 retries failed starts
forever (FailureConfig.controller_failure_limit = -1): 8 tries in 9.5 minutes were seen, each
with a traceback, no `[wellfed]` line, the MLflow run RUNNING. Here `ray.max_failures` bounds
both kinds of restart; then the driver looks at the cluster: with less room than the run's
workers, it continues from the last checkpoint on the workers that fit, the same global batch
(more micro-batches per worker), into the same MLflow run (`ray.on_lost_node: shrink`), or
stops with one line saying what shrank and what to run, the MLflow run FAILED and its
checkpoint kept (`stop`, and whenever no worker fits at all).

Ray gives up on a group it could not place (WorkerGroupStartupTimeoutError after its restarts)
even when the cluster still lists room for it: a node killed a moment ago is listed alive until
the GCS's health checks give up on it, and room may be held by other work. That is a shortage
all the same: at most one worker fewer than Ray could not place, and no more than the
cluster's free resources hold, so it shrinks or stops as above; never `training failed`.

A trial Ray placed (one worker, one Ray task: train/run/placement.py) whose node died is sent again
from its last checkpoint, at most `ray.max_failures` times; Ray runs it where there is room (on
the head once a trial running there ends), into the same MLflow run.
"""

from __future__ import annotations

import dataclasses

from wellfed import cluster
from wellfed.config import RayConfig
from wellfed.train.run.failures import TrainingFailed

LOST_TAG = "wellfed.lost_node"
"""Run tag: what a lost node did to the run, in the console's words (the latest time)."""


def room_left(nodes: list[dict], per_worker: dict[str, float], workers: int,
              strategy: str = "PACK") -> int | None:
    """After training failed: how many workers fit the cluster's live `nodes` now, when that is
    fewer than `workers` (a node was lost); None when they all still fit (another failure).
    STRICT_SPREAD places one worker per node."""
    if strategy == "STRICT_SPREAD":
        room = sum(cluster.room([node], per_worker) > 0 for node in nodes)
    else:
        room = cluster.room(nodes, per_worker)
    return room if room < workers else None


def unplaced_room(free: dict, per_worker: dict[str, float], workers: int) -> int:
    """Room after Ray could not place `workers` although the cluster lists room for them: fewer
    than it asked for, and no more than the free resources (all nodes together) hold."""
    return min(workers - 1, cluster.room([free], per_worker))


def shrink_line(nodes: list[dict], room: int, workers: int, max_failures: int,
                step: int | None, unplaced: bool = False) -> str:
    """What the cluster is now and what it did to the run: the first half of either line."""
    kept = f"the checkpoint of step {step} is kept" if step else "no checkpoint yet"
    if unplaced:  # the cluster still lists the room Ray could not use
        return (f"a node was lost or its room is held: Ray could not place the run's {workers} "
                f"worker(s) after its restarts (ray.max_failures: {max_failures}, each start "
                f"waiting RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S); the cluster lists "
                f"{cluster.described(nodes)}, with free room for {room} of the run's {workers} "
                f"worker(s); {kept}")
    return (f"a node was lost: the cluster has {cluster.described(nodes)} now, room for {room} "
            f"of the run's {workers} worker(s), after Ray's restarts (ray.max_failures: "
            f"{max_failures}); {kept}")


def continuing(nodes: list[dict], room: int, workers: int, max_failures: int, step: int | None,
               global_batch: int, accumulation: int, unplaced: bool = False) -> str:
    """ray.on_lost_node: shrink, and a worker fits: the run goes on, said in one line."""
    where = shrink_line(nodes, room, workers, max_failures, step, unplaced)
    return (f"{where}; continuing on {room} "
            f"worker(s) from step {step or 0}, the same global batch of {global_batch} rows "
            f"({accumulation} micro-batch(es) per worker per step), into the same MLflow run "
            "(ray.on_lost_node: shrink)")


def stopped(nodes: list[dict], room: int, workers: int, max_failures: int,
            step: int | None, unplaced: bool = False) -> TrainingFailed:
    """ray.on_lost_node: stop (or no worker fits at all): the line that says what to run."""
    where = shrink_line(nodes, room, workers, max_failures, step, unplaced)
    if room == 0:
        todo = "add a node that can hold a worker, then rerun `dvc repro` to resume"
    else:
        todo = (f"rerun with `dvc exp run -S ray.num_workers={room}` (or set ray.num_workers: "
                f"{room} in params.yaml and `dvc repro`) to resume on the workers that fit, the "
                "same global batch, into the same MLflow run; or add a node and rerun `dvc repro`")
    return TrainingFailed(f"{where} (ray.on_lost_node: stop); {todo}")


def after_ray_train(workers: RayConfig, asked: RayConfig, per_worker: dict[str, float],
                    train_cfg, step: int | None, uri: str, run_id: str,
                    unplaced: int = 0) -> RayConfig | None:
    """After a Ray Train fit failed: None when the cluster still holds `workers` (the failure
    was not a lost node: the caller raises it); else the config to continue with (fewer
    workers), said in one line and tagged on the MLflow run; or raise `stopped`'s line.
    `unplaced`: the workers Ray could not place when it gave up (failures.TrainingFailed), a
    shortage even where the cluster lists room for them."""
    from wellfed.track import run_details, tracking
    from wellfed.train.run.mlflow_run import world_size_change

    nodes = cluster.live_nodes()
    room = room_left(nodes, per_worker, workers.num_workers, workers.placement_strategy)
    listed = room is None and unplaced > 0
    if listed:
        room = unplaced_room(cluster.available(), per_worker, workers.num_workers)
    if room is None:
        return None
    if room == 0 or asked.on_lost_node == "stop":
        stop = stopped(nodes, room, workers.num_workers, asked.max_failures, step, listed)
        tracking.set_tags(uri, run_id, {LOST_TAG: str(stop)})
        raise stop
    line = continuing(nodes, room, workers.num_workers, asked.max_failures, step,
                      train_cfg.global_batch_size, train_cfg.accumulation_steps(room), listed)
    print(f"[wellfed] {line}", flush=True)
    derived = {"derived.world_size": room,
               "derived.accumulation_steps": train_cfg.accumulation_steps(room)}
    world_size_change(uri, run_id, derived)  # derived.world_sizes: every count the run had
    run_details.log_derived(uri, run_id, derived)  # the worker count a tag, the rest details
    tracking.set_tags(uri, run_id, {LOST_TAG: line})
    return dataclasses.replace(workers, num_workers=room)


def node_lost(err: BaseException) -> bool:
    """Whether a placed trial's Ray task ended because its node or its process died, not by an
    error of its own (which Ray hands back as the trial's exception)."""
    import ray.exceptions

    return isinstance(err, (ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError))


def resend_line(label: str, restarts: int, max_failures: int, step: int | None,
                err: BaseException) -> str:
    """A placed trial sent again after its node was lost."""
    cause = type(err).__name__
    return (f"{label}: its node or process was lost ({cause}); sending it again from "
            f"{f'the checkpoint of step {step}' if step else 'step 0'} (restart {restarts} of "
            f"ray.max_failures: {max_failures}), into the same MLflow run, where Ray has room")


def placed_given_up(label: str, max_failures: int, step: int | None,
                    err: BaseException) -> TrainingFailed:
    kept = f"the checkpoint of step {step} is kept" if step else "no checkpoint yet"
    return TrainingFailed(f"{label}: its node or process was lost ({type(err).__name__}) "
                          f"{max_failures + 1} time(s), more than ray.max_failures: "
                          f"{max_failures} restarts; {kept}: rerun `dvc repro` to resume it "
                          "into the same MLflow run once the cluster is sound")
