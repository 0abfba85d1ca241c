"""A fused group's state at its last rung, so that a stopped search goes on from there.

After each rung a group goes on from (its validation, the halving and the compaction done), it
writes everything the rest of its training reads: which trials are alive, their slices of the
weights and of the optimizer's state, the schedules, the random states, where the data order
stands and what each trial recorded so far. A group started with that file goes on from that
step as if it had never stopped: the same batches, dropout masks and updates (the fused-trials
tests check it to every digit). The file is written whole or not at all (a temporary file
renamed over it): a stop while it is written leaves the rung before. It holds tensors and plain
Python values only and is read with torch's weights_only, as a checkpoint is: a file planted in
the search's folder never gets to run code (`read`).

A search that halves across all its trials (search/rounds.py) keeps each trial's own slice of
that state instead (`save_each`), and builds the next rung's group from the slices of the
trials that go on (`merged`): trials of one seed at one step share the data order and the
random states, so only their weights, moments and schedules differ.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import torch

from wellfed.train.checkpoints import random_state

VERSION = 2
"""2: plain values only. 1 held numpy's scalars and arrays, read with `NUMPY` allowed."""
READS = (1, 2)
NUMPY = [np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, np.float64(0).__reduce__()[0],
         *(type(np.dtype(t)) for t in (np.float64, np.float32, np.int64, np.int32, np.bool_))]
"""What a version-1 state (a search stopped before an upgrade) needs beyond weights_only's
tensors: numpy's array and scalar rebuilders (found through their own pickling, numpy's public
API) and its number dtypes; an object array still needs globals nothing allows."""


def state_of(*, done: int, alive: list[int], trials: int, next_at: tuple[int, int], fused, opt,
             out, device: torch.device, seeds: list[int]) -> dict:
    """The group's state after `done` steps, `alive` (indices among the `trials` it began
    with, of these `seeds`) going on from (epoch, index) `next_at`; trials of different seeds
    keep each its own random state (trials/apart.py's Streams)."""
    streams = fused.streams.states if fused.streams is not None else None
    return {"version": VERSION, "done": done, "alive": list(alive), "trials": trials,
            "seeds": list(seeds), "streams": streams,
            "next_at": list(next_at), "weights": fused.state_dict(),
            "stacked": [name for name, _ in fused.named_parameters()], "opt": opt.state(),
            "random": random_state.capture(device), "out": plain({
                "history": out.history, "validations": out.validations,
                "steps": out.steps, "tokens": out.tokens, "logits": out.logits})}


def plain(value):
    """`value` with numpy's scalars as Python numbers and its arrays as tensors, which torch's
    weights_only reads back."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def read(path: Path) -> dict:
    """A state file loaded with weights_only; a file it refuses (planted, damaged, truncated) is
    a ValueError of one line naming it."""
    try:
        with torch.serialization.safe_globals(NUMPY):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same refusal
        text = str(err).strip()
        named = re.search(r"(?:unsupported|Unsupported global:) GLOBAL (\S+)", text)
        why = (f"it names {named.group(1)}, which a group's state never holds" if named else
               text.splitlines()[0][:160] if text else type(err).__name__)
        raise ValueError(f"{path} is not a group state this search wrote ({why})") from None


def save(path: Path, **group) -> None:
    """`state_of(**group)` written to `path`, whole or not at all."""
    write(path, state_of(**group))


def write(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    torch.save(state, part)
    os.replace(part, path)


def save_each(paths: dict[int, Path], **group) -> None:
    """Each alive trial's slice of the group's state to its own file (trial index -> path): a
    group of one, with nothing recorded (its records went to the search with the group's)."""
    state = state_of(**group)
    for pos, k in enumerate(state["alive"]):
        def own(value: torch.Tensor) -> torch.Tensor:  # a copy: a view saves all K slices
            return value[pos:pos + 1].clone()

        write(paths[k], {**state, "alive": [0], "trials": 1, "out": {},
                         "seeds": state["seeds"][pos:pos + 1],
                         "streams": state["streams"] and state["streams"][pos:pos + 1],
                         "weights": {
            name: own(value) if name in state["stacked"] else value
            for name, value in state["weights"].items()},
            "opt": {"avg": [own(a) for a in state["opt"]["avg"]],
                    "sq": [own(s) for s in state["opt"]["sq"]],
                    "counts": [state["opt"]["counts"][pos]],
                    "schedules": [state["opt"]["schedules"][pos]]}})


def merged(paths: list[Path]) -> dict:
    """One group's state from trial slices `save_each` wrote, in this order: they must have
    stopped at the same step of the same data order (one seed: the same random states)."""
    parts = [read(p) for p in paths]
    first = parts[0]
    for path, part in zip(paths, parts):
        if part.get("version") not in READS or part.get("trials") != 1:
            raise ValueError(f"{path} is not one trial's state of this version")
        if (part["done"], part["next_at"]) != (first["done"], first["next_at"]):
            raise ValueError(f"{path} stopped at step {part['done']}, {paths[0]} at "
                             f"{first['done']}: only trials at one step train as one group")
        if part.get("seeds") != first.get("seeds") or part.get("streams"):
            raise ValueError(f"{path} is a trial of seed {part.get('seeds')}, {paths[0]} of "
                             f"{first.get('seeds')}: slices go on as one group of one seed")
    stacked = set(first["stacked"])
    weights = {name: torch.cat([p["weights"][name] for p in parts]) if name in stacked
               else value for name, value in first["weights"].items()}
    opt = {"avg": [torch.cat(m) for m in zip(*(p["opt"]["avg"] for p in parts))],
           "sq": [torch.cat(m) for m in zip(*(p["opt"]["sq"] for p in parts))],
           "counts": [p["opt"]["counts"][0] for p in parts],
           "schedules": [p["opt"]["schedules"][0] for p in parts]}
    n = len(parts)
    out = {"history": {k: [] for k in range(n)}, "validations": {k: [] for k in range(n)},
           "steps": {}, "logits": {}, "tokens": {"real": 0, "computed": 0, "alone": 0}}
    return {**first, "alive": list(range(n)), "trials": n, "weights": weights, "opt": opt,
            "out": out}


def load(path: Path | None, trials: int, seeds: list[int] | None = None) -> dict | None:
    """The state `save` wrote for a group of `trials` (of these `seeds`, where given), or None
    where there is none (or it was written by another version or for another group: the group
    then starts afresh). A file `read` refuses is set aside as <name>.unreadable, said in one
    line, and the group starts afresh."""
    if path is None or not path.is_file():
        return None
    try:
        state = read(path)
    except ValueError as err:
        aside = path.with_name(path.name + ".unreadable")
        os.replace(path, aside)
        # the process's own stdout: a search sends a group's output to its log, this is news
        print(f"[wellfed] {err}: set aside as {aside.name}; the group starts again from step 0",
              file=sys.__stdout__, flush=True)
        return None
    if state.get("version") not in READS or state.get("trials") != trials:
        return None
    if seeds is not None and "seeds" in state and state["seeds"] != [seeds[k] for k in
                                                                      state["alive"]]:
        return None  # the same trials' places, other seeds (search.seeds changed)
    return state


def restore(state: dict, fused, opt, out, device: torch.device, seed: int) -> list[int]:
    """Put `state` back into a freshly built group (all its trials alive); returns the trials
    alive. Dropout goes on with the saved random states."""
    alive = state["alive"]
    if len(alive) < fused.trials:
        fused.keep(alive)
        opt.keep(alive, list(fused.named_parameters()))
    fused.load_state_dict(state["weights"])
    if state.get("streams"):
        fused.streams.states = list(state["streams"])
    opt.load(state["opt"])
    for key, value in state["out"].items():
        setattr(out, key, value)
    random_state.restore([state["random"]], device, 0, 1, seed, state["done"])
    return list(alive)
