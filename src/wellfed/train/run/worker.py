"""The Ray Train adapter: Ray's context in, `ray.train.report` out. The loop itself (loop.train)
knows nothing of Ray; going distributed is this file.

Checkpoints: rank 0 reports each one with `checkpoint_upload_fn`, so wellfed's store
(train/checkpoints/store.py) writes it (temporary name, manifest, rename) into this fit's launch
folder and Ray registers what the store wrote. A worker starts from `ray.train.get_checkpoint()`,
the latest one Ray registered (after a worker restart), else from the store's checkpoint the driver
checked (`WorkerConfig.resume`: Ray V2 leaves a run's first checkpoint to the train function).

An error no retry can fix (a damaged checkpoint, a bad value, a full or read-only folder) is
told to the driver's StopFlag before it is raised; the worker group Ray restarts for it
(`ray.max_failures`) then returns at once, and the driver raises the first error's line.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from wellfed.outputs import unwritable
from wellfed.train.checkpoints.checkpoint import Damaged
from wellfed.train.checkpoints.preemption import StopCheck
from wellfed.train.checkpoints.store import Store
from wellfed.train.step import selection
from wellfed.train.step.loop import Place, TrainJob, train


def permanent(err: BaseException) -> bool:
    """Whether a retry from the last checkpoint would fail the same way."""
    return isinstance(err, (ValueError, Damaged)) or unwritable(err)


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker is given: Ray Train's `train_loop_config` holds it under one key,
    `worker`."""

    job: TrainJob
    threads: int
    """torch threads (ray.cpus_per_worker)."""
    store: Store
    launch: str
    """This fit's launch folder in the store."""
    resume: object = None
    """The ray.train.Checkpoint the driver found good, or None: start from step 0."""
    stop_flag: object = None
    """The run's StopFlag actor (preemption.py)."""
    tokens_uri: str | None = None
    """Shared storage the token files were staged to (multi-node), else None."""
    tokens_hash: str | None = None


def train_loop_per_worker(config: dict) -> None:
    import ray
    import ray.train
    import ray.train.torch
    from transformers.utils import logging as hf_logging

    worker: WorkerConfig = config["worker"]
    flag = worker.stop_flag
    if flag is not None and ray.get(flag.failure.remote()):
        return  # an earlier attempt hit a permanent error: the driver raises its line
    hf_logging.disable_progress_bar()  # the driver shows progress; workers stay quiet
    torch.set_num_threads(worker.threads)
    job, store, launch = worker.job, worker.store, worker.launch
    if worker.tokens_uri:  # multi-node: this node's local copy of the staged files
        from wellfed.data.staging import localize

        job = dataclasses.replace(job, tokens_dir=localize(worker.tokens_uri, worker.tokens_hash))
    ctx = ray.train.get_context()
    place = Place(ray.train.torch.get_device(), ctx.get_world_rank(), ctx.get_world_size(),
                  ray.get_runtime_context().get_node_id())

    def report(metrics: dict, directory: Path | None) -> None:
        if directory is None:
            ray.train.report(metrics)
            return
        step, rank = metrics["records"][-1]["step"], metrics.get(selection.RANK_KEY, 0)

        def upload(ckpt, name: str):
            return ray.train.Checkpoint(store.commit(Path(ckpt.path), launch, step, rank),
                                        filesystem=store.fs)

        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory),
                         checkpoint_upload_fn=upload)

    # Ray V2's way to start from a given checkpoint: the latest one Ray registered in this fit
    # (after a worker restart), else the one the driver passed (what the store found good).
    saved = ray.train.get_checkpoint() or worker.resume
    stop = StopCheck(flag)  # SIGTERM/SIGINT on the driver: preemption.py
    try:
        with saved.as_directory() if saved else contextlib.nullcontext() as resume:
            train(job, place, report, resume=Path(resume) if resume else None,
                  wrap=ray.train.torch.prepare_model, stop=stop.check)
    except Exception as err:
        if flag is not None and permanent(err):
            from wellfed.train.run.failures import RAY_LOGS, message

            ray.get(flag.fail.remote(message(place.rank, err, RAY_LOGS)))
        raise
