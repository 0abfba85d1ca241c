"""Validation during training: the task's figures over every rank's share of the split."""

from __future__ import annotations

import torch

from wellfed import device as dev
from wellfed import tasks
from wellfed.data.batching import collate, eval_batches, eval_spec
from wellfed.data.token_files import TokenFile


def evaluate_split(s, data: TokenFile, rank: int, pad_id: int, k: int) -> dict[str, float]:
    """The task's validation figures over all ranks of Setup `s` (each takes every
    world_size-th sorted batch; their sums meet in one all-reduce). A shape plan validates on
    its own widths at EVAL_ROWS x the rows (data/batching.py), filler rows left out."""
    planned = s.graphs is not None
    spec = eval_spec(s.spec) if planned else s.spec
    s.model.eval()
    totals = None
    with torch.no_grad():
        for idx in eval_batches(data.lengths, spec, rank):
            host = collate(data, idx, pad_id, spec)
            batch = dev.to_device(host, s.device)
            with dev.autocast(s.device, s.precision):
                logits = (dev.forward_planned(s.model, batch, s.graphs.full_mask) if planned
                          else dev.forward(s.model, batch, host))
            n = len(idx)  # the real rows come first
            sums = tasks.val_stats(s.task, logits[:n], batch["labels"][:n])
            totals = sums if totals is None else totals + sums
    if totals is None:  # a rank with no validation batch still joins the all-reduce
        totals = tasks.val_stats(s.task, torch.zeros((0, k), device=s.device),
                                 torch.zeros((0,) + data.labels.shape[1:], device=s.device,
                                             dtype=torch.long if data.labels.ndim == 1
                                             else torch.float32))
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)
    s.model.train()
    return tasks.val_metrics(s.task, totals.tolist(), k)
