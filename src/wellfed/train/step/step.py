"""One optimizer step: forward and backward over the step's micro-batches, then the update.

The dynamic path (below) sends each micro-batch as it comes; the planned path (train/step/graphs.py)
pads it to one of the shape plan's shapes and, on a CUDA GPU, replays CUDA graphs. Both share
the update and the out-of-memory redo.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch

from wellfed import device as dev
from wellfed import tasks
from wellfed.data.batching import Step
from wellfed.telemetry.meter import StepMeter
from wellfed.train.step import autobatch, graphs
from wellfed.train.step.setup import Setup


class StepResult(NamedTuple):
    """One optimizer step's figures, still on the device."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    skipped: torch.Tensor
    """1.0 when fp16's GradScaler found an overflow and skipped the update."""


def accumulate(s: Setup, step: Step, batches: Iterator[dict], meter: StepMeter,
               lengths: np.ndarray) -> torch.Tensor:
    """Forward and backward of this rank's micro-batches of `step`, gradients summed in the
    parameters; returns the step's loss, still on the device."""
    model = s.model if s.compiled is None else s.compiled
    no_sync = getattr(s.model, "no_sync", contextlib.nullcontext)
    loss_sum = torch.zeros((), device=s.device)
    rows_n = real = padded = 0
    for i, idx in enumerate(step.micro):
        with meter.waiting():
            host = next(batches)
        with meter.copying():
            batch = dev.to_device(host, s.device)
        rows_n, real = rows_n + len(idx), real + int(lengths[idx].sum())
        padded += int(np.prod(host["input_ids"].shape))
        last = i == len(step.micro) - 1
        with meter.computing(), (contextlib.nullcontext() if last else no_sync()):
            with dev.autocast(s.device, s.precision):
                logits = dev.forward(model, batch, host, keep_mask=s.compiled is not None)
            rows = tasks.row_loss(s.task, logits, batch["labels"], s.loss_weights)
            # Sum over this rank's rows / rows in the global batch; DDP averages gradients over
            # ranks, so x world makes the gradient that of the whole global batch's mean loss.
            loss = (rows * batch["weights"]).sum() * s.world / step.global_rows
            s.scaler.scale(loss).backward()
        loss_sum += loss.detach()
    meter.count(rows_n, real, padded)  # once the step went through: a redone step counts once
    return loss_sum


def update(s: Setup, set_to_none: bool = True) -> tuple[torch.Tensor, float]:
    """Unscale, clip, step, zero the gradients: (gradient norm on the device, 1.0 when fp16's
    GradScaler found an overflow and skipped the update). The planned path keeps the gradients
    allocated (set_to_none=False): its graphs add to them in place."""
    s.scaler.unscale_(s.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(),
                                               s.max_grad_norm or float("inf"))
    scale = s.scaler.get_scale() if s.scaler.is_enabled() else 0.0  # fp16 only (syncs anyway)
    s.scaler.step(s.optimizer)
    s.scaler.update()
    s.optimizer.zero_grad(set_to_none=set_to_none)
    skipped = float(s.scaler.is_enabled() and s.scaler.get_scale() < scale)  # overflow: skipped
    return grad_norm.detach().float(), skipped


def train_step(s: Setup, step: Step, batches: Iterator[dict], meter: StepMeter,
               lengths: np.ndarray, gather: Callable[[np.ndarray], dict] | None = None
               ) -> StepResult:
    """One optimizer step over this rank's micro-batches of `step`. Given `gather` (row indices
    -> host micro-batch), a CUDA out-of-memory error halves the token budget and redoes the
    step cut finer (autobatch.redo; one worker only): the update is the one the smaller budget
    would have made from the start, up to dropout's random masks."""
    forward_backward = accumulate if s.graphs is None else graphs.accumulate
    while True:
        try:
            loss_sum = forward_backward(s, step, batches, meter, lengths)
            break
        except torch.OutOfMemoryError:
            if gather is None:
                raise
        step, batches = autobatch.redo(s, step, batches, lengths, gather)
    if s.graphs is not None:
        return StepResult(loss_sum, *graphs.update(s, meter, update))
    with meter.computing():
        grad_norm, skipped = update(s)
        s.scheduler.step()
    # torch.full, not torch.tensor: a host scalar copied to the GPU waits for the stream (a sync
    # per step); a fill kernel does not.
    return StepResult(loss_sum, grad_norm, torch.full((), skipped, device=s.device))
