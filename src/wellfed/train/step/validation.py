"""Validation during training: the task's figures over every rank's share of the split."""

from __future__ import annotations

import numpy as np
import torch

from wellfed import device as dev
from wellfed import tasks
from wellfed.data.batching import collate, eval_batches, eval_spec
from wellfed.data.token_files import TokenFile


def evaluate_split(s, data: TokenFile, rank: int, pad_id: int, k: int,
                   keep_logits: bool = False) -> tuple[dict[str, float], np.ndarray | None]:
    """The task's validation figures over all ranks of Setup `s` (each takes every
    world_size-th sorted batch; their sums meet in one all-reduce), and with `keep_logits` (one
    worker) every row's logits in file order: the export fits the threshold and the temperature
    on them instead of predicting the split again. A shape plan validates on its own widths at
    EVAL_ROWS x the rows (data/batching.py), filler rows left out."""
    planned = s.graphs is not None
    spec = eval_spec(s.spec) if planned else s.spec
    s.model.eval()
    totals, kept = None, []
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
            if keep_logits:  # on the device until the end: no sync per batch
                kept.append((idx, logits[:n].float()))
    if totals is None:  # a rank with no validation batch still joins the all-reduce
        totals = tasks.val_stats(s.task, torch.zeros((0, k), device=s.device),
                                 torch.zeros((0,) + data.labels.shape[1:], device=s.device,
                                             dtype=torch.long if data.labels.ndim == 1
                                             else torch.float32))
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)
    s.model.train()
    rows = None
    if keep_logits:
        rows = np.zeros((len(data), k), np.float32)
        for idx, values in kept:
            rows[idx] = values.cpu().numpy()
    return tasks.val_metrics(s.task, totals.tolist(), k), rows
