"""The Ray Train adapter: Ray's context in, `ray.train.report` out. The loop itself (loop.train)
knows nothing of Ray; going distributed is this file."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import torch

from wellfed.train.loop import Place, TrainJob, train
from wellfed.train.preemption import StopCheck


def train_loop_per_worker(config: dict) -> None:
    import ray
    import ray.train
    import ray.train.torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the driver shows progress; workers stay quiet
    torch.set_num_threads(config["threads"])
    job: TrainJob = config["job"]
    if config.get("tokens_uri"):  # multi-node: this node's local copy of the staged files
        from wellfed.data.staging import localize

        job = dataclasses.replace(job, tokens_dir=localize(config["tokens_uri"],
                                                           config["tokens_hash"]))
    ctx = ray.train.get_context()
    place = Place(ray.train.torch.get_device(), ctx.get_world_rank(), ctx.get_world_size(),
                  ray.get_runtime_context().get_node_id())

    def report(metrics: dict, directory: Path | None) -> None:
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory)
                         if directory else None)

    saved = ray.train.get_checkpoint()
    stop = StopCheck(config.get("stop_flag"))  # SIGTERM/SIGINT on the driver: preemption.py
    with saved.as_directory() if saved else contextlib.nullcontext() as resume:
        train(job, place, report, resume=Path(resume) if resume else None,
              wrap=ray.train.torch.prepare_model, stop=stop.check)
