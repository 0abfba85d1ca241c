"""Every random state a step draws from, per rank: seeded once at a fresh start, saved into each
checkpoint and put back at a resume, so a stopped run goes on as the uninterrupted run would
have (the same dropout masks, step for step).

What the loop draws from after its start: dropout, from torch's default generator of the
device (the CPU's, or the CUDA device's, which the graphed step's captures replay from). Python's
`random` and numpy's global generator are kept too: cheap, and a library that draws from them
(none does in the step today) cannot fork a resumed run. The data order needs nothing here: it
is a pure function of (seed, epoch) and the sampler's position in train_state.json
(data/batching.py), and the loader processes' DataLoader draws its seed from a generator of its
own (train/step/feeding.py), never from the default one.

A fresh run seeds every torch generator of the process with `train.seed + rank` after the model
is built (the model's initialisation has its own `torch.manual_seed(train.seed)`, the same on
every rank); from there each rank's generators only move forward. A checkpoint holds one
record per rank (rank 0 gathers them: `gather`), as tensors and plain numbers, so the
weights-only load that reads the checkpoint (checkpoint.py here) reads them without a pickle.
A resume on another worker count, or from a checkpoint made before this file, cannot put every
rank's state back: each rank is then seeded with `train.seed + 7919 x step + rank` (what every
resume did before) and rank 0 says so once.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

RESEED = 7919
"""The step's factor in the fallback seed (a prime: seeds of nearby steps and ranks differ)."""


def seed(base: int, rank: int) -> None:
    """A fresh run's generators: torch's (the CPU's and every CUDA device's) with base + rank,
    so ranks draw different dropout masks."""
    torch.manual_seed(base + rank)


def capture(device: torch.device) -> dict:
    """This process's random states, as tensors and plain numbers."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {"torch": torch.get_rng_state(),
             "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                        "gauss": gauss},
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)),
                       "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(cached)}}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def gather(device: torch.device) -> list[dict]:
    """Every rank's `capture`, in rank order (a collective: every rank calls it at the same
    step; one worker: its own)."""
    mine = capture(device)
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [mine]
    every = [None] * torch.distributed.get_world_size()
    # NCCL sends the objects from the current CUDA device: this rank's, whatever is current.
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        torch.distributed.all_gather_object(every, mine)
    return [{k: to_cpu(v) for k, v in state.items()} for state in every]


def to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    return value


def restore(saved: list[dict] | None, device: torch.device, rank: int, world: int,
            base: int, step: int) -> str | None:
    """Put back this rank's states from a checkpoint's `saved` (one record per rank); when they
    cannot all be put back (another worker count, a checkpoint without them), seed from
    (base, step, rank) instead and return the reason, in a few words (None: restored)."""
    reason = None
    if not saved:
        reason = "the checkpoint keeps no random state"
    elif len(saved) != world:
        reason = f"the checkpoint's {len(saved)} worker(s) are {world} now"
    elif device.type == "cuda" and "cuda" not in saved[rank]:
        reason = "the checkpoint was made on a CPU"
    if reason:
        seed(base + RESEED * step, rank)
        return reason
    state = saved[rank]
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["gauss"]))
    return None


def reseeded_line(reason: str, step: int) -> str:
    """What rank 0 prints when a resume could not put the random states back."""
    return (f"[wellfed] resuming at step {step} with dropout reseeded ({reason}): the steps "
            "from here draw other masks than the uninterrupted run would have")
