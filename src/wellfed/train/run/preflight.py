"""Before Ray starts: what the request asks for, whether this machine or cluster can place it,
whether every folder the run writes into takes its files, and which engine runs it (in this
process, or on Ray Train)."""

from __future__ import annotations

from pathlib import Path

from wellfed import cluster
from wellfed.cluster import cluster_address
from wellfed.config import RayConfig, TrainConfig
from wellfed.outputs import check_room

REPORTS_BYTES = 2_000_000  # data/train: history CSVs, plots, diagnosis (~0.3 MB on the demo)


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
    (train/run/local.py), without Ray Train's ~21 s start and stop."""
    return (ray_cfg.in_process == "auto" and ray_cfg.num_workers == 1
            and not cluster_address(ray_cfg))


def check_outputs(job, store, outputs: tuple[Path, Path], mlflow_folder: Path | None) -> None:
    """Before the MLflow run opens and anything trains: every folder the run writes into takes
    a file and has room for it (outputs.check_room), or the stage stops with the line a failed
    write would give after the training (a read-only data/ cost 90 s of training first). The
    bytes are estimates from the model's weights (model.weight_bytes): a checkpoint holds them
    and, full fine-tuning, AdamW's two moments (3x; LoRA ~1x) -- the checkpoints still to come
    under train.keep_checkpoints, in the store (a local one); the exported model beside
    `outputs`' model folder; the MLflow store's copy of it (a local one); the reports."""
    from wellfed.model import weight_bytes
    from wellfed.train.run.runs import kept_while_running, planned_steps

    weights = weight_bytes(job.model_source)
    steps, every = planned_steps(job), job.train.checkpoint_every
    planned = -(-steps // every) if every else 1  # every N steps, and always the last one
    done = len(store.entries())
    keep = kept_while_running(job.train)
    # all: the ones not written yet; N: the N newest + the best + the one being written, less
    # those already there
    coming = max(1, planned - done if keep is None
                 else min(planned, keep + 2) - min(done, keep + 1))
    places: dict[Path, int] = {}

    def add(folder: Path, count: int) -> None:
        places[folder] = places.get(folder, 0) + count

    if store.renames:  # a local folder (NFS too); an object store's room is not ours to know
        add(Path(store.dir).parent, coming * weights * (1 if job.model.lora_r else 3))
    model_dir, reports = outputs
    add(model_dir.parent, weights)  # built beside data/model, renamed into place
    add(reports, REPORTS_BYTES)
    if mlflow_folder is not None:
        add(mlflow_folder, weights)
    check_room(places)


def check_stores(uri: str, configured: str, project: Path) -> None:
    """Before any work: the MLflow store answers (track/stores.py) and the project's default
    DVC remote, a folder, takes files. Either refusal is one line naming the setting and the fix;
    nothing is trained or written."""
    from wellfed.track import stores

    try:
        stores.check_store(uri, stores.setting(configured))
    except ValueError as err:
        raise ValueError(f"{err}; nothing was trained") from None
    check_remote(project)


def check_remote(project: Path) -> None:
    """The default DVC remote (core.remote), when it is a folder (NFS, a mounted share): it, or
    the nearest folder above it that exists (`dvc push` makes the rest), takes a file. A remote
    elsewhere (s3://, ssh://) is not probed: its credentials are dvc's."""
    import tempfile
    from urllib.parse import urlsplit

    from dvc.config import Config

    dvc_dir = project / ".dvc"
    texts = [f.read_text(errors="replace") for f in (dvc_dir / "config", dvc_dir / "config.local")
             if f.is_file()]
    if not any("remote" in text for text in texts):  # no remote here: skip dvc's ~0.3 s config
        return  # load (a default remote set in the user's global dvc config is not probed)
    config = Config(dvc_dir=str(dvc_dir))  # system, global, project and local levels
    name = config["core"].get("remote")
    if not name or name not in config["remote"]:
        return
    url = config["remote"][name]["url"]
    parts = urlsplit(url)
    if parts.scheme not in ("", "file") or (len(parts.scheme) == 1 and ":" in url):
        return
    folder = Path(parts.path if parts.scheme == "file" else url)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".wellfed-probe-"):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ValueError(
            f"the DVC remote '{name}' (core.remote; remote.{name}.url = {url}) does not take "
            f"files ({folder}: {reason}): `dvc push` would fail after training; make it "
            f"writable, point it elsewhere (`dvc remote modify {name} url <folder>`), or train "
            "without a default remote in this clone (`dvc config --local core.remote \"\"`); "
            "nothing was trained") from None
