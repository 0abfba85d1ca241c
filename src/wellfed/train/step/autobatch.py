"""The token budget of a micro-batch (`train.micro_batch_tokens`): found on the GPU before
training (`auto`), and halved when a step runs out of GPU memory.

A micro-batch's activation memory grows with its padded tokens (rows x width), so one budget
in tokens holds for short and long rows alike; the probe measures it where it is tightest, at
the longest padded row of the train split. Neither the probe nor a halving changes what is
learned: the global batches and the loss normalisation (by `Step.global_rows`) do not depend on
the budget, only how each global batch is cut into micro-batches for gradient accumulation.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Iterator

import numpy as np
import torch

from wellfed import device as dev
from wellfed.config import number
from wellfed.data.batching import BatchSpec, Step, micro_shape, padded_tokens, split_step
from wellfed.errors import StageError
from wellfed.train.checkpoints.checkpoint import unwrap
from wellfed.train.step import graphs

HEADROOM = 0.85
"""Share of the probed budget, and of the device's memory, that training may use: the probe
runs one shape on a fresh allocator, while training mixes widths (allocator fragmentation),
validates between steps and, under DDP, holds NCCL's gradient buckets besides."""

BISECT_TO = 16
"""Bisection stops once the gap is under 1/16 (6%) of the fitting row count: a finer answer
would be lost under the 15% headroom, and each probe is a full forward and backward."""


def largest_fit(fits: Callable[[int], bool], most: int) -> int:
    """The largest n in [1, most] with fits(n), 0 when not even 1 fits: double from 1, then
    bisect. Memory grows with rows, so fits is taken to be monotone."""
    lo, n = 0, 1
    while True:
        n = min(n, most)
        if not fits(n):
            hi = n
            break
        if n == most:
            return most
        lo, n = n, 2 * n
    while hi - lo > max(1, lo // BISECT_TO):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def budget_for(rows: int, width: int, most: int) -> int:
    """Tokens per micro-batch for `rows` fitting rows of `width` tokens: x HEADROOM, except when
    the most rows a micro-batch can hold fit (the token bound then never binds)."""
    if rows == 0:
        return 0
    if rows >= most:
        return most * width
    return max(width, int(rows * width * HEADROOM))


def agree(tokens: int, device: torch.device) -> int:
    """The smallest budget over all ranks (all-reduce MIN): every rank cuts every rank's
    micro-batches from one plan, and DDP needs the same count of them on each."""
    if not torch.distributed.is_initialized():
        return tokens
    value = torch.tensor([tokens], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MIN)
    return int(value.item())


def synthetic(rows: int, width: int) -> dict[str, np.ndarray]:
    """A host batch of `rows` x `width` tokens, one position padded: dev.forward then takes the
    masked attention path, which needs more memory than the unmasked one."""
    mask = np.ones((rows, width), np.int64)
    if width > 1:
        mask[0, -1] = 0
    return {"input_ids": np.ones((rows, width), np.int64), "attention_mask": mask}


def cuda_fits(model, device: torch.device, precision: dev.Precision,
              width: int) -> Callable[[int], bool]:
    """fits(rows): a forward and backward of rows x width under the run's autocast ran without
    a CUDA out-of-memory error and the allocator's peak stayed under HEADROOM of the device.
    Runs on the bare module: a forward through DDP would arm its gradient all-reduce, and a
    rank that ran out of memory would leave the others waiting in it."""
    bare = unwrap(model)
    ceiling = HEADROOM * torch.cuda.get_device_properties(device).total_memory

    def attempt(rows: int) -> int:
        host = synthetic(rows, width)
        batch = dev.to_device(host, device)
        with dev.autocast(device, precision):
            logits = dev.forward(bare, batch, host)
        logits.float().sum().backward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_reserved(device)

    def fits(rows: int) -> bool:
        torch.cuda.reset_peak_memory_stats(device)
        try:
            ok = attempt(rows) <= ceiling
        except torch.OutOfMemoryError:
            ok = False
        # Outside the except: the traceback (and the tensors its frames hold) is gone by now.
        bare.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return ok

    return fits


def probe(model, device: torch.device, precision: dev.Precision, width: int, most: int) -> int:
    """Rows of `width` tokens that fit in one micro-batch on this GPU (0 = not even one). The
    optimizer's state (AdamW: two fp32 moments per trainable weight) only appears at the first
    step, so placeholders of its size are held while probing."""
    state = [torch.empty_like(p, dtype=torch.float32) for p in model.parameters()
             if p.requires_grad for _ in range(2)]
    try:
        return largest_fit(cuda_fits(model, device, precision, width), most)
    finally:
        del state
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)  # the run's peak-memory figures are its own


def choose(requested: int | str, model, device: torch.device, precision: dev.Precision,
           lengths: np.ndarray | None, spec: BatchSpec) -> tuple[int, str]:
    """(tokens per micro-batch, how they were chosen) for `train.micro_batch_tokens`."""
    if requested != "auto":
        return number(requested, integer=True), "set in params"
    if device.type != "cuda":
        return 0, ("auto: CPU, rows only (running out of host memory swaps or ends the "
                   "process: there is no out-of-memory error for a probe to catch)")
    if lengths is None or not len(lengths):
        raise ValueError("train.micro_batch_tokens auto needs the train rows' lengths to probe "
                         "at the longest; pass lengths to setup()")
    width = spec.width(lengths.max())
    most = min(spec.micro_rows, math.ceil(spec.global_batch / spec.world_size))
    start = time.perf_counter()
    rows = probe(model, device, precision, width, most)
    tokens = agree(budget_for(rows, width, most), device)
    if tokens == 0:
        raise StageError(f"train.micro_batch_tokens auto: one row of {width} tokens does not fit "
                         f"in {dev.device_name(device)}'s memory (on at least one worker); use a "
                         f"smaller model, LoRA (model.lora_r) or a shorter tokenize.max_length")
    fit = ("all " if rows >= most else "") + f"{rows} rows x {width} tokens fit"
    scaled = "" if rows >= most else f" x {HEADROOM} headroom"
    return tokens, (f"auto: probed at the longest row, {fit}{scaled} -> {tokens} tokens "
                    f"(the smallest over workers; {time.perf_counter() - start:.1f} s)")


def halved(spec: BatchSpec, step: Step, lengths: np.ndarray, world: int) -> int:
    """The budget after an out-of-memory error in `step`: half its largest micro-batch's padded
    tokens, not below one row of its longest row. Raises when that one row already failed, and
    under DDP (world > 1), where one rank cannot redo a step alone: the others would wait for it
    in the gradient all-reduce. There the error names the budget to set instead."""
    parts = [m for m in step.micro if len(m)]
    width = spec.width(max(lengths[m].max() for m in parts))
    largest = max(math.prod(micro_shape(m, lengths, spec)) for m in parts)
    smaller = max(largest // 2, width)
    if smaller >= largest:
        raise StageError(f"CUDA out of memory with one row of {width} tokens per micro-batch: the "
                         f"model does not fit on this GPU; use a smaller model, LoRA "
                         f"(model.lora_r) or a shorter tokenize.max_length")
    if world > 1:
        raise StageError(f"CUDA out of memory in a micro-batch of {largest} tokens (epoch "
                         f"{step.epoch}, batch {step.index}); {world} workers cannot redo a step "
                         f"one at a time: set train.micro_batch_tokens: {smaller}")
    return smaller


def recut(step: Step, spec: BatchSpec, lengths: np.ndarray) -> Step:
    """`step` cut into micro-batches under `spec` (one rank): what the plan would have held had
    `spec` been used from the start (the rows come back in the plan's longest-first order)."""
    rows = np.concatenate([m for m in step.micro if len(m)])
    parts = split_step(rows, lengths, spec)
    return dataclasses.replace(step, micro=parts[0],
                               padded_tokens=padded_tokens(parts, lengths, spec))


def redo(s, step: Step, batches: Iterator[dict], lengths: np.ndarray,
         gather: Callable[[np.ndarray], dict]) -> tuple[Step, Iterator[dict]]:
    """After an out-of-memory error in `step`: drop its partial gradients, free the cached
    blocks, halve `s.spec`'s budget (later steps keep it) and return the step re-cut with it and
    its host micro-batches. The rest of the old ones are drained, so a DataLoader feeding the
    plan stays in step."""
    for _ in batches:
        pass
    # The planned step's graphs add to gradients in place: keep them allocated, drop the graphs
    # (their shapes change with the budget) and their memory.
    s.optimizer.zero_grad(set_to_none=s.graphs is None)
    if s.graphs is not None:
        graphs.reset(s.graphs)
    if s.device.type == "cuda":
        torch.cuda.empty_cache()
    tokens = halved(s.spec, step, lengths, s.world)
    print(f"[wellfed] CUDA out of memory (epoch {step.epoch}, batch {step.index}): "
          f"micro_batch_tokens {s.spec.micro_tokens or 'rows only'} -> {tokens}; redoing the "
          f"step", flush=True)
    s.spec = dataclasses.replace(s.spec, micro_tokens=tokens)
    s.halvings += 1
    step = recut(step, s.spec, lengths)
    return step, (gather(idx) for idx in step.micro)
