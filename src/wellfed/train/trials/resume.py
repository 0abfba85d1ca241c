"""A fused group's state at its last rung, so that a stopped search goes on from there.

After each rung a group goes on from (its validation, the halving and the compaction done), it
writes everything the rest of its training reads: which trials are alive, their slices of the
weights and of the optimizer's state, the schedules, the random states, where the data order
stands and what each trial recorded so far. A group started with that file goes on from that
step as if it had never stopped: the same batches, dropout masks and updates (the fused-trials
tests check it to every digit). The file is written whole or not at all (a temporary file
renamed over it): a stop while it is written leaves the rung before.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from wellfed.train.checkpoints import random_state

VERSION = 1


def save(path: Path, *, done: int, alive: list[int], trials: int, next_at: tuple[int, int],
         fused, opt, out, device: torch.device) -> None:
    """The group's state after `done` steps, `alive` (indices among the `trials` it began
    with) going on from (epoch, index) `next_at`."""
    state = {"version": VERSION, "done": done, "alive": list(alive), "trials": trials,
             "next_at": list(next_at), "weights": fused.state_dict(), "opt": opt.state(),
             "random": random_state.capture(device), "out": {
                 "history": out.history, "validations": out.validations,
                 "steps": out.steps, "tokens": out.tokens, "logits": out.logits}}
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    torch.save(state, part)
    os.replace(part, path)


def load(path: Path | None, trials: int) -> dict | None:
    """The state `save` wrote for a group of `trials`, or None where there is none (or it was
    written by another version or for another group: the group then starts afresh)."""
    if path is None or not path.is_file():
        return None
    # our own file, in the search's folder: its random states hold Python tuples and numpy
    # values, which only a full unpickling reads
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("version") != VERSION or state.get("trials") != trials:
        return None
    return state


def restore(state: dict, fused, opt, out, device: torch.device, seed: int) -> list[int]:
    """Put `state` back into a freshly built group (all its trials alive); returns the trials
    alive. Dropout goes on with the saved random states."""
    alive = state["alive"]
    if len(alive) < fused.trials:
        fused.keep(alive)
        opt.keep(alive, list(fused.named_parameters()))
    fused.load_state_dict(state["weights"])
    opt.load(state["opt"])
    for key, value in state["out"].items():
        setattr(out, key, value)
    random_state.restore([state["random"]], device, 0, 1, seed, state["done"])
    return list(alive)
