"""Before Ray starts: what the request asks for, whether this machine or cluster can place it,
and which engine runs it (in this process, or on Ray Train)."""

from __future__ import annotations

from wellfed import cluster
from wellfed.cluster import cluster_address
from wellfed.config import RayConfig, TrainConfig


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


def devices(train_cfg: TrainConfig, ray_cfg: RayConfig) -> None:
    """What this machine can already tell about its own devices."""
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
    devices(train_cfg, ray_cfg)


def wants_gpu(ray_cfg: RayConfig) -> bool:
    import ray

    return (ray_cfg.use_gpu == "true" or
            (ray_cfg.use_gpu == "auto" and ray.cluster_resources().get("GPU", 0) > 0))


def in_process(ray_cfg: RayConfig) -> bool:
    """ray.in_process: auto = one worker and no cluster to join trains in this process
    (train/local.py), without Ray Train's ~21 s start and stop."""
    return (ray_cfg.in_process == "auto" and ray_cfg.num_workers == 1
            and not cluster_address(ray_cfg))
