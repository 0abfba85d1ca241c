"""Connecting to Ray, for every command that uses it (training, predict on a cluster).

A local Ray started for this process, or the cluster `ray.address` / $RAY_ADDRESS names; either
way the workers get the same environment: offline Hub, telemetry off (privacy.worker_env),
TOKENIZERS_PARALLELISM=false, and on a remote cluster the wellfed package itself.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from wellfed import privacy
from wellfed.config import RayConfig

log = logging.getLogger(__name__)


# Ray's loggers that `quiet_ray_logs` quiets, by name: strings, not imports, so a Ray release
# that moves them brings their lines back rather than breaking the run (tests/test_public_apis.py).
RAY_TRAIN = "ray.train.v2._internal.execution"
NOISY_WARNINGS = (f"{RAY_TRAIN}.controller.placement_group_cleaner",
                  f"{RAY_TRAIN}.scaling_policy.autoscaling_coordinator_client")
REPORT_LOGGER = ("train", "v2", "_internal", "execution", "context.py")
"""The file (under Ray's package) whose logger, named after the file, logs every report."""


def quiet_ray_logs() -> None:
    """Runs in every Ray worker process: keep the console for people, not Ray internals.

    Ray 2.60 logs every `ray.train.report` payload at INFO under a logger named after its file
    (so `LoggingConfig` does not reach it), and the placement-group cleaner warns once a second
    when the state API (the dashboard, off here) is absent. On a busy machine the controller's
    autoscaling-coordinator client warns, with a traceback, that its resource request timed out
    ("safe to ignore", in Ray's own words). The payloads stay in Ray's log files; the warnings
    of those two modules are dropped (their errors pass) by a filter on their logger, not by its
    level: Ray Train's logging setup (dictConfig of `ray.train`) resets the level of every logger
    under `ray.train` to NOTSET after this hook has run, but keeps filters.
    The cleaner finds its cluster through RAY_ADDRESS; unset, it looks for Ray on this machine
    and dies with a traceback when it finds two (two pipelines at once: `dvc queue start -j 2`).
    """
    import ray

    logging.getLogger(os.path.join(os.path.dirname(ray.__file__), *REPORT_LOGGER)).setLevel(
        logging.WARNING)
    for name in NOISY_WARNINGS:
        logging.getLogger(name).addFilter(lambda record: record.levelno >= logging.ERROR)
    os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)


def cluster_address(ray_cfg: RayConfig) -> str:
    return ray_cfg.address or os.environ.get("RAY_ADDRESS", "")


def local_token_auth(ray_cfg: RayConfig) -> None:
    """A local cluster gets Ray's default, token authentication, asked for explicitly
    (RAY_AUTH_MODE=token) so Ray does not print a warning about choosing it on every run.
    Ray reads the variable once, when it is imported: set it only before that (a process that
    imported Ray already keeps Ray's own default and its warning)."""
    if not cluster_address(ray_cfg) and "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def connect(ray_cfg: RayConfig) -> None:
    """Start a local Ray for this process, or join `ray_cfg.address` / $RAY_ADDRESS; log what
    the cluster has (nodes, CPUs, GPUs)."""
    import ray

    address = cluster_address(ray_cfg)
    # RAY_TRAIN_ENABLE_PRINT_PATCH=0: Ray Train's print patch sends a worker's print() both to
    # stdout and, through the root logger, to stderr; Ray forwards both, so every line a
    # worker printed reached the console twice. (A variable exported here still wins: Ray
    # Train passes its own variables on to the workers.)
    env = {"env_vars": {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                  "WELLFED_CACHE", "MLFLOW_LOGGING_LEVEL")
                        if k in os.environ}
                       | {"TOKENIZERS_PARALLELISM": "false", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
                       | privacy.worker_env(),  # telemetry off on every node, `ray start` ones too
           "worker_process_setup_hook": "wellfed.cluster.quiet_ray_logs"}
    if address:
        # Workers on other nodes get this package through the runtime environment; its
        # dependencies must be installed there (docs/scale-out.md).
        import wellfed

        env["py_modules"] = [str(Path(wellfed.__file__).parent)]
        ray.init(address=address, runtime_env=env, log_to_driver=True,
                 logging_level=logging.WARNING)
    else:
        # One machine: no other node whose drain Ray Train's preemption watcher could announce.
        # Without the watcher Ray does not log, as an error, a note on the watcher's own actor
        # options on every run (`core_worker.cc ... PreemptionWatcher ... max_restarts > 0`).
        env["env_vars"]["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "0"
        # Ray starts workers at nice 15 (the raylet's worker_niceness), so on a small machine
        # the training worker yields the cores to Ray's own actors and the driver: measured here
        # at ~176% of 2 cores. A local cluster runs nothing else of ours: full priority.
        env["env_vars"]["RAY_worker_niceness"] = "0"
        # address="local": never attach to a cluster some earlier `ray start` left recorded.
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, runtime_env=env,
                 log_to_driver=True, logging_level=logging.WARNING)
    res = ray.cluster_resources()
    log.info("ray: %s, %d node(s), %g CPUs, %g GPUs", address or "local",
             len([n for n in ray.nodes() if n["Alive"]]), res.get("CPU", 0), res.get("GPU", 0))


def live_nodes() -> list[dict]:
    """The resources ({"CPU": 2.0, "GPU": 1.0, ...}) of every live node of the connected cluster."""
    import ray

    return [n["Resources"] for n in ray.nodes() if n["Alive"]]


def available() -> dict:
    """What the connected cluster has free now, all nodes together ({"CPU": 1.0, ...})."""
    import ray

    return ray.available_resources()


def room(nodes: list[dict], per_worker: dict[str, float]) -> int:
    """How many workers that each need `per_worker` ({"CPU": 2, "GPU": 1}) fit on `nodes`."""
    return sum(min(int(n.get(k, 0) // v) for k, v in per_worker.items()) for n in nodes)


def described(nodes: list[dict]) -> str:
    """`2 node(s), 4 CPUs, 0 GPUs`: what a "do not fit" message says the cluster has."""
    return (f"{len(nodes)} node(s), {sum(n.get('CPU', 0) for n in nodes):g} CPUs, "
            f"{sum(n.get('GPU', 0) for n in nodes):g} GPUs")
