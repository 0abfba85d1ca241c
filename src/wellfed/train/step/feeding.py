"""Host micro-batches for the step, in plan order: gathered inline or by loader processes."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Iterator

import torch

from wellfed.data.batching import BatchSpec, MicroBatches, Step, collate, iterate_steps
from wellfed.data.token_files import TokenFile


def feed(s, data: TokenFile, path: Path, pad_id: int, rank: int = 0, epoch: int = 0,
         index: int = 0, epochs: int = 1, loader_workers: int = 0, prefetch: int = 2):
    """(step, host micro-batches) of this rank of Setup `s` from (epoch, index) on, cut with
    `s.spec`. The replan signal is `s.halvings`, which an out-of-memory redo counts up
    (train/step/autobatch.py) as it halves the budget: the rest is then planned again with the new
    budget. The global batches do not depend on it, only their cut into micro-batches does."""
    while True:
        spec, halvings = s.spec, s.halvings
        plan = iterate_steps(data.lengths, spec, rank, epoch, index, epochs)
        for step, batches in micro_batches(plan, data, path, pad_id, spec, loader_workers,
                                           prefetch, s.device.type == "cuda"):
            yield step, batches
            if s.halvings != halvings:  # the step just taken halved the budget: replan
                epoch, index = step.epoch, step.index + 1
                break
        else:
            return


def ignore_stop_signals(_worker_id: int) -> None:
    """A loader process ignores SIGTERM and SIGINT: sent to the run's process group, they are for
    the driver, which stops after the step under way (train/checkpoints/preemption.py) and needs its
    loaders until then; the loader processes end with their parent."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def micro_batches(steps: Iterator[Step], data: TokenFile, path: Path, pad_id: int,
                  spec: BatchSpec, loader_workers: int, prefetch: int, pin: bool):
    """Yield (step, host micro-batches) in plan order, each shaped by `spec` (collate); with
    loader_workers > 0 a torch DataLoader gathers ahead in background processes, one epoch at a
    time."""
    if loader_workers == 0:
        for step in steps:
            yield step, (collate(data, idx, pad_id, spec) for idx in step.micro)
        return
    epoch_steps: list[Step] = []

    def flush():
        plan = [idx for s in epoch_steps for idx in s.micro]
        # A generator of its own: a DataLoader draws its processes' base seed from the one it
        # is given, else from torch's default one, dropout's, which a resume mid-epoch (a new
        # DataLoader there) would then move one draw ahead of the uninterrupted run's.
        loader = iter(torch.utils.data.DataLoader(
            MicroBatches(str(path), plan, pad_id, spec), batch_size=None, shuffle=False,
            num_workers=loader_workers, prefetch_factor=prefetch, pin_memory=pin,
            worker_init_fn=ignore_stop_signals, generator=torch.Generator().manual_seed(0)))
        for s in epoch_steps:
            yield s, (next(loader) for _ in s.micro)

    for step in steps:
        if epoch_steps and step.epoch != epoch_steps[-1].epoch:
            yield from flush()
            epoch_steps = []
        epoch_steps.append(step)
    if epoch_steps:
        yield from flush()
