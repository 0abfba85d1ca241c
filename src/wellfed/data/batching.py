"""Length-bucketed, token-budget, rank-aware, resumable batches over a token file.

One optimizer step consumes one *global batch* of `global_batch_size` rows, the same rows
whatever the world size. Per epoch (seeded by seed and epoch):
  1. shuffle all rows, cut them into pools of `pool_batches` global batches;
  2. sort each pool by length and cut it into global batches (rows of similar length together);
  3. shuffle the order of the global batches.
Each global batch is dealt to the ranks in a snake order over its length-sorted rows (token load
balanced), and each rank cuts its share into micro-batches bounded by rows and by a token budget
that counts padding. Every rank gets the same number of micro-batches, as DDP needs; a rank
with too few rows gets weight-0 filler rows, so no row is ever seen twice in an epoch.

The whole plan is a pure function of (lengths, seed, epoch, sizes), so every rank computes it
locally and a resumed run regenerates it and continues from the next unseen step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np


@dataclass(frozen=True)
class BatchSpec:
    global_batch: int
    """Rows per optimizer step over all ranks."""
    world_size: int = 1
    micro_rows: int = 32
    """Most rows in one micro-batch."""
    micro_tokens: int = 0
    """Most padded tokens in one micro-batch (0 = no token bound)."""
    pad_multiple: int = 1
    seed: int = 0
    pool_batches: int = 64


@dataclass(frozen=True)
class Step:
    epoch: int
    index: int
    """Step index inside the epoch."""
    global_rows: int
    """Rows in the global batch over all ranks: the loss is normalised by it."""
    micro: list[np.ndarray]
    """This rank's micro-batches (row indices; may be empty arrays = filler)."""
    real_tokens: int = 0
    """Non-pad tokens in the global batch (all ranks)."""
    padded_tokens: int = 0
    """Tokens computed for the global batch on all ranks, padding included."""


def padded_width(length: int, multiple: int) -> int:
    return -(-int(length) // multiple) * multiple


def steps_per_epoch(n_rows: int, global_batch: int) -> int:
    return -(-n_rows // global_batch)


def global_batches(lengths: np.ndarray, spec: BatchSpec, epoch: int) -> list[np.ndarray]:
    """The epoch's global batches: every row exactly once, similar lengths together."""
    rng = np.random.default_rng([spec.seed, epoch])
    order = rng.permutation(len(lengths))
    pool = spec.global_batch * spec.pool_batches
    batches = []
    for start in range(0, len(order), pool):
        chunk = order[start:start + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i:i + spec.global_batch] for i in range(0, len(chunk), spec.global_batch)]
    return [batches[i] for i in rng.permutation(len(batches))]


def deal(rows: np.ndarray, lengths: np.ndarray, world_size: int) -> list[np.ndarray]:
    """Split rows over ranks in snake order of length, so each rank gets a similar token load."""
    rows = rows[np.argsort(-lengths[rows], kind="stable")]
    lap = np.concatenate([np.arange(world_size), np.arange(world_size)[::-1]])
    owner = np.resize(lap, len(rows))
    return [rows[owner == r] for r in range(world_size)]


def cut(rows: np.ndarray, lengths: np.ndarray, spec: BatchSpec) -> list[np.ndarray]:
    """Greedy micro-batches over rows sorted longest first, within the row and token bounds."""
    parts, start = [], 0
    while start < len(rows):
        width = padded_width(lengths[rows[start]], spec.pad_multiple)
        take = spec.micro_rows
        if spec.micro_tokens:
            take = max(1, min(take, spec.micro_tokens // width))
        parts.append(rows[start:start + take])
        start += take
    return parts


def even_out(parts: list[np.ndarray], count: int) -> list[np.ndarray]:
    """Split the largest parts until there are `count`; pad with empty (filler) parts."""
    parts = [p for p in parts if len(p)]
    while len(parts) < count:
        biggest = max(range(len(parts)), key=lambda i: len(parts[i]), default=None)
        if biggest is None or len(parts[biggest]) < 2:
            parts.append(np.zeros(0, np.int64))
            continue
        half = len(parts[biggest]) // 2
        parts[biggest:biggest + 1] = [parts[biggest][:half], parts[biggest][half:]]
    return parts


def split_step(rows: np.ndarray, lengths: np.ndarray, spec: BatchSpec) -> list[list[np.ndarray]]:
    """Micro-batches of every rank for one global batch, the same count on each rank."""
    shares = deal(rows, lengths, spec.world_size)
    cuts = [cut(share, lengths, spec) for share in shares]
    count = max(1, max(len(c) for c in cuts))
    return [even_out(c, count) for c in cuts]


def iterate_steps(lengths: np.ndarray, spec: BatchSpec, rank: int, start_epoch: int = 0,
                  start_index: int = 0, epochs: int = 1) -> Iterator[Step]:
    """This rank's steps from (start_epoch, start_index) on: the resumable sampler."""
    for epoch in range(start_epoch, epochs):
        batches = global_batches(lengths, spec, epoch)
        first = start_index if epoch == start_epoch else 0
        for index in range(first, len(batches)):
            every_rank = split_step(batches[index], lengths, spec)
            yield Step(epoch, index, len(batches[index]), every_rank[rank],
                       int(lengths[batches[index]].sum()),
                       padded_tokens(every_rank, lengths, spec.pad_multiple))


def padded_tokens(every_rank: list[list[np.ndarray]], lengths: np.ndarray, multiple: int) -> int:
    """Tokens computed for one global batch's micro-batches on all ranks, padding included (a
    filler micro-batch is one pad token)."""
    return int(sum(len(m) * padded_width(lengths[m].max(), multiple) if len(m) else 1
                   for parts in every_rank for m in parts))


def eval_batches(lengths: np.ndarray, spec: BatchSpec, rank: int) -> list[np.ndarray]:
    """Sorted by length, no shuffle; rank r takes every world_size-th batch."""
    order = np.argsort(-lengths, kind="stable")
    return cut(order, lengths, spec)[rank::spec.world_size]


def collate(data, idx: np.ndarray, pad_id: int, multiple: int) -> dict[str, np.ndarray]:
    """Host batch with per-row loss weights; an empty share becomes one weight-0 pad row."""
    if len(idx):
        batch = data.gather(idx, pad_id, multiple)
        batch["weights"] = np.ones(len(idx), np.float32)
        return batch
    filler = {"input_ids": np.full((1, 1), pad_id, np.int64),
              "attention_mask": np.ones((1, 1), np.int64),
              "labels": np.zeros((1,) + data.labels.shape[1:],
                                 np.int64 if data.labels.ndim == 1 else np.float32),
              "weights": np.zeros(1, np.float32)}
    if data.segments is not None:
        filler["token_type_ids"] = np.zeros((1, 1), np.int64)
    return filler


class MicroBatches:
    """Map-style dataset: item i is the i-th micro-batch of a plan, gathered from a token file.

    Used with a torch DataLoader when `data.loader_workers` > 0: each loader process opens its own
    memory map on first use (pickling the arrays would copy them), and DataLoader keeps order.
    """

    def __init__(self, path: str, plan: list[np.ndarray], pad_id: int, multiple: int):
        self.path, self.plan, self.pad_id, self.multiple = path, plan, pad_id, multiple
        self._data = None

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if self._data is None:
            from wellfed.data.shards import TokenFile

            self._data = TokenFile(self.path)
        return collate(self._data, self.plan[i], self.pad_id, self.multiple)

    def __getstate__(self):
        return {**self.__dict__, "_data": None}
