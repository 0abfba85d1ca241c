"""Trials of different seeds in one group (the final check: finalists x seeds), each with the
data order, dropout and initialisation it has alone.

- **Data.** Each distinct seed has its own batch plan (data/batching.py draws the order from
  train.seed) and its own feed; trials of one seed share it. At each micro-batch the trials'
  own host batches are stacked into one batch of K blocks (`stacked`), each padded to the
  largest rows and width among them. Each block's own shape, the (rows, width) the trial
  computes alone, goes with it: dropout and attention run on that region only
  (trials/layers.py), so the padding changes nothing a trial computes, only what the group
  computes. That cost is counted: the tokens the group computed against the tokens its trials
  alone would have (GroupRun.tokens, "computed" and "alone").
- **Dropout.** Each trial draws from its own state of the device's generator (`Streams`),
  seeded as the trial alone seeds its run, and kept in the group's saved state at a rung.
- **Initialisation.** The group loads the model once per seed, as each trial alone draws its
  head (trials/group.py).

A step whose trials have different numbers of micro-batches (a token budget cuts each seed's
batches differently) gives a trial without an i-th micro-batch an empty block: no rows, no
draw, no loss.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch

from wellfed import device as dev
from wellfed import tasks


class Streams:
    """Each trial's own state of the device's default generator (dropout draws from it), for
    trials of different seeds: `use(k)` puts trial k's in, and keeps where it ended."""

    def __init__(self, states: list[torch.Tensor], device: torch.device):
        self.states, self.device = list(states), device

    @classmethod
    def seeded(cls, seeds: list[int], device: torch.device) -> "Streams":
        """As each trial alone seeds its run (train/checkpoints/random_state.py, rank 0)."""
        states = []
        for seed in seeds:
            torch.manual_seed(seed)
            states.append(get_state(device))
        return cls(states, device)

    @contextlib.contextmanager
    def use(self, k: int):
        set_state(self.states[k], self.device)
        try:
            yield
        finally:
            self.states[k] = get_state(self.device)

    def keep(self, trials: list[int]) -> None:
        self.states = [self.states[k] for k in trials]


def get_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def set_state(state: torch.Tensor, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def feeds(s, seeds: list[int], data, path, pad_id: int, epoch: int, index: int, epochs: int,
          loader_workers: int, prefetch: int):
    """Each seed's (step, host micro-batches) from (epoch, index) on (train/step/feeding.py's
    `feed` with the seed's own plan), step by step: one pair per seed, in `seeds`' order."""
    from wellfed.train.step.feeding import feed

    plans = [feed(s if seed == s.spec.seed else
                  dataclasses.replace(s, spec=dataclasses.replace(s.spec, seed=seed)), data,
                  path, pad_id, 0, epoch, index, epochs, loader_workers, prefetch)
             for seed in seeds]
    return zip(*plans)


def stacked(hosts: list[dict | None], pad_id: int):
    """One host batch of the trials' own micro-batches (None: a trial without one), block after
    block, each padded to the largest rows and width: filler rows are pad tokens with their
    first token attended (attention stays finite), weight 0. Returns (batch, own shapes,
    whether each own batch is padded). Host batches may come as numpy arrays (gathered inline)
    or as CPU tensors (from loader processes: data.loader_workers)."""
    hosts = [None if h is None else {key: np.asarray(value) for key, value in h.items()}
             for h in hosts]
    real = [h for h in hosts if h is not None]
    rows = max(len(h["input_ids"]) for h in real)
    width = max(h["input_ids"].shape[1] for h in real)
    template = real[0]
    blocks, own, masked = [], [], []
    for host in hosts:
        if host is None:
            host = {key: value[:0] for key, value in template.items()}
        n, w = host["input_ids"].shape
        block = {}
        for key, value in host.items():
            if key in ("input_ids", "attention_mask", "token_type_ids"):
                fill = pad_id if key == "input_ids" else 0
                value = np.pad(value, ((0, rows - n), (0, width - w)), constant_values=fill)
                if key == "attention_mask":
                    value[n:, 0] = 1
            else:
                value = np.concatenate([value, np.zeros((rows - n,) + value.shape[1:],
                                                        value.dtype)])
            block[key] = value
        blocks.append(block)
        own.append((n, w) if n else (0, 0))
        masked.append(bool(n) and not bool(host["attention_mask"].all()))
    batch = {key: np.concatenate([b[key] for b in blocks]) for key in blocks[0]}
    return batch, own, masked


def step_apart(fused, opt, s, steps: list, batches: list, of: list[int], task: str,
               pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One optimizer step of every trial, each on its own seed's step (`steps`, `batches`: one
    per seed; `of`: each alive trial's seed position): forward and backward of the stacked
    micro-batches, each trial's loss normalised as a run alone normalises it, clip, update.
    Returns each trial's loss and gradient norm, (K,) each, on the device, and the tokens the
    group computed."""
    k = len(of)
    loss_sum = torch.zeros(k, device=s.device)
    computed = 0
    used = sorted(set(of))  # a seed whose trials a halving dropped is not gathered any more
    for i in range(max(len(steps[j].micro) for j in used)):
        hosts = {j: next(batches[j]) if i < len(steps[j].micro) else None for j in used}
        host, own, masked = stacked([hosts[j] for j in of], pad_id)
        computed += int(host["input_ids"].size)
        batch = dev.to_device(host, s.device)
        with dev.autocast(s.device, s.precision):
            logits = fused(batch["input_ids"],
                           batch["attention_mask"] if any(masked) or len(set(own)) > 1
                           else None, batch.get("token_type_ids"), own=own, masked=masked)
        rows = logits.shape[1]
        labels, weights = (batch[key].reshape(k, rows, *batch[key].shape[1:])
                           for key in ("labels", "weights"))
        losses = []
        for t, (n, _w) in enumerate(own):
            if not n:
                losses.append(logits.new_zeros((), dtype=torch.float32))
                continue
            row = tasks.row_loss(task, logits[t, :n], labels[t, :n], s.loss_weights)
            losses.append((row * weights[t, :n]).sum() * s.world
                          / steps[of[t]].global_rows)
        loss = torch.stack(losses)
        loss.sum().backward()
        loss_sum += loss.detach()
    norms = opt.clip()
    opt.step()
    opt.zero_grad()
    return loss_sum, norms.detach(), computed
