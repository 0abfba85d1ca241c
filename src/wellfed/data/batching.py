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

import bisect
import math
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
    widths: tuple[int, ...] = ()
    """The GPU's shape plan (data/shapes.py): the padded widths a micro-batch may have,
    ascending, the last one the longest row's; () = each micro-batch is padded to its longest
    row, rounded up to `pad_multiple`."""

    def width(self, length: int) -> int:
        """The padded width of a micro-batch whose longest row has `length` tokens."""
        if not self.widths:
            return padded_width(length, self.pad_multiple)
        i = bisect.bisect_left(self.widths, int(length))
        if i == len(self.widths):
            raise ValueError(f"a row of {length} tokens is longer than the shape plan's widest "
                             f"shape ({self.widths[-1]}); plan the shapes from these lengths")
        return self.widths[i]

    def rows_at(self, width: int) -> int:
        """Rows of a micro-batch `width` tokens wide: at most micro_rows, fewer under the token
        budget. In a shape plan it is the fixed row count of every micro-batch of that width
        (weight-0 filler rows make up a short one), evened out so that a rank's share of a
        global batch splits into equal parts: 256 rows at a cap of 248 are 2 x 128, not 248 + 8
        rows and 240 of filler."""
        cap = self.micro_rows
        if self.micro_tokens:
            cap = max(1, min(cap, self.micro_tokens // width))
        if not self.widths:
            return cap
        share = math.ceil(self.global_batch / self.world_size)
        return math.ceil(share / math.ceil(share / cap))

    def shapes(self) -> list[tuple[int, int]]:
        """The (rows, width) of every micro-batch a shape plan can make ([] without one)."""
        return [(self.rows_at(w), w) for w in self.widths]


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
        take = spec.rows_at(spec.width(lengths[rows[start]]))
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
                       padded_tokens(every_rank, lengths, spec))


def micro_shape(idx: np.ndarray, lengths: np.ndarray, spec: BatchSpec) -> tuple[int, int]:
    """(rows, width) the micro-batch of rows `idx` is computed as: its own rows at its padded
    width, or in a shape plan the plan's shape (an empty one: the narrowest, all filler)."""
    if not spec.widths:
        return (len(idx), spec.width(lengths[idx].max())) if len(idx) else (1, 1)
    width = spec.width(lengths[idx].max()) if len(idx) else spec.widths[0]
    return spec.rows_at(width), width


def padded_tokens(every_rank: list[list[np.ndarray]], lengths: np.ndarray,
                  spec: BatchSpec) -> int:
    """Tokens computed for one global batch's micro-batches on all ranks, padding and filler
    rows included."""
    return int(sum(math.prod(micro_shape(m, lengths, spec)) for parts in every_rank
                   for m in parts))


EVAL_ROWS = 4
"""Validation and prediction take this many times the training micro-batch's rows and tokens:
without a backward pass nothing is kept for gradients, so a forward needs a fraction of a
training step's activation memory."""


def eval_spec(spec: BatchSpec) -> BatchSpec:
    """`spec` for forward passes only: EVAL_ROWS x the rows and tokens, the same widths."""
    rows = spec.micro_rows * EVAL_ROWS
    return BatchSpec(global_batch=rows * spec.world_size, world_size=spec.world_size,
                     micro_rows=rows, micro_tokens=spec.micro_tokens * EVAL_ROWS,
                     pad_multiple=spec.pad_multiple, seed=spec.seed, widths=spec.widths)


def padded_widths(lengths: np.ndarray, spec: BatchSpec) -> np.ndarray:
    """`spec.width` of each length, at once."""
    if not spec.widths:
        return -(-lengths.astype(np.int64) // spec.pad_multiple) * spec.pad_multiple
    at = np.searchsorted(spec.widths, lengths, side="left")
    if (at == len(spec.widths)).any():
        spec.width(int(lengths.max()))  # says which row is too long for the plan
    return np.asarray(spec.widths)[at]


def eval_batches(lengths: np.ndarray, spec: BatchSpec, rank: int) -> list[np.ndarray]:
    """Sorted by length, no shuffle, each batch of rows of one padded width (`spec.width`): a
    batch never pads a row to a longer neighbour's width, so where widths are exact (a CPU,
    pad_multiple 1) a batch has no padding and attention takes its unmasked path (SST-2's dev
    rows through MiniLM: 1.23x faster on one thread, 1.18x on two, than batches cut across
    widths, benchmarks/eval_batches.py); rank r takes every world_size-th batch."""
    order = np.argsort(-lengths, kind="stable")
    if not len(order):
        return []
    widths = padded_widths(lengths[order], spec)
    starts = np.flatnonzero(np.diff(widths)) + 1  # where the padded width changes
    return [part for run in np.split(order, starts) for part in cut(run, lengths, spec)
            ][rank::spec.world_size]


def collate(data, idx: np.ndarray, pad_id: int, spec: BatchSpec) -> dict[str, np.ndarray]:
    """Host batch with per-row loss weights, shaped as `micro_shape` says: the real rows first,
    then weight-0 filler rows (pad tokens, the first one attended so attention stays finite,
    label 0); an empty share without a shape plan is one filler row."""
    rows, width = micro_shape(idx, data.lengths, spec)
    batch = (data.gather(idx, pad_id, width=width) if len(idx) else
             {"input_ids": np.zeros((0, width), np.int64),
              "attention_mask": np.zeros((0, width), np.int64),
              "labels": np.zeros((0,) + data.labels.shape[1:], data.labels.dtype
                                 if data.labels.ndim > 1 else np.int64)})
    if data.segments is not None and "token_type_ids" not in batch:
        batch["token_type_ids"] = np.zeros((0, width), np.int64)
    batch["weights"] = np.ones(len(idx), np.float32)
    fill = rows - len(idx)
    if fill:
        filler = {"input_ids": np.full((fill, width), pad_id, np.int64),
                  "attention_mask": np.eye(1, width, dtype=np.int64).repeat(fill, 0),
                  "labels": np.zeros((fill,) + batch["labels"].shape[1:], batch["labels"].dtype),
                  "weights": np.zeros(fill, np.float32)}
        if "token_type_ids" in batch:
            filler["token_type_ids"] = np.zeros((fill, width), np.int64)
        batch = {key: np.concatenate([value, filler[key]]) for key, value in batch.items()}
    return batch


class MicroBatches:
    """Map-style dataset: item i is the i-th micro-batch of a plan, gathered from a token file.

    Used with a torch DataLoader when `data.loader_workers` > 0: each loader process opens its own
    memory map on first use (pickling the arrays would copy them), and DataLoader keeps order.
    """

    def __init__(self, path: str, plan: list[np.ndarray], pad_id: int, spec: BatchSpec):
        self.path, self.plan, self.pad_id, self.spec = path, plan, pad_id, spec
        self._data = None

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if self._data is None:
            from wellfed.data.token_files import TokenFile

            self._data = TokenFile(self.path)
        return collate(self._data, self.plan[i], self.pad_id, self.spec)

    def __getstate__(self):
        return {**self.__dict__, "_data": None}
