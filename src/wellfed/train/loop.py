"""`train_loop_per_worker`: what every Ray Train worker runs. The step fits on one screen.

Every worker reports every `report_every` steps (never every step: each report can wait on the
controller's 2 s poll); the driver-side callback decides what lands in MLflow. Losses and token
counts stay on the device between reports and cross the host/device boundary once per report.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wellfed import device as dev
from wellfed.config import from_dict
from wellfed.data.batching import BatchSpec, eval_batches, iterate_steps, steps_per_epoch
from wellfed.data.shards import TokenFile
from wellfed.model import load_model

STATE_FILE = "train_state.json"


def build_optimizer(model, cfg):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "norm" in name else decay).append(param)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)


def total_steps(n_rows: int, cfg) -> int:
    planned = cfg.epochs * steps_per_epoch(n_rows, cfg.global_batch_size)
    return min(planned, cfg.max_steps) if cfg.max_steps else planned


def unwrap(model):
    return getattr(model, "module", model)


def evaluate_split(model, data: TokenFile, spec: BatchSpec, rank: int, device, precision, pad_id):
    """Validation loss/accuracy over all ranks (each takes every world_size-th sorted batch)."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # correct, loss sum, rows
    with torch.no_grad():
        for idx in eval_batches(data.lengths, spec, rank):
            batch = dev.to_device(data.gather(idx, pad_id, spec.pad_multiple), device)
            with dev.autocast(device, precision):
                logits = model(input_ids=batch["input_ids"],
                               attention_mask=batch["attention_mask"]).logits.float()
            totals[0] += (logits.argmax(-1) == batch["labels"]).sum()
            totals[1] += F.cross_entropy(logits, batch["labels"], reduction="sum")
            totals[2] += len(idx)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals)
    model.train()
    correct, loss, rows = totals.tolist()
    return {"val/accuracy": correct / max(rows, 1), "val/loss": loss / max(rows, 1)}


def micro_batch(data: TokenFile, idx: np.ndarray, pad_id: int, multiple: int) -> dict:
    """Host batch with per-row loss weights; an empty share becomes one weight-0 pad row."""
    if len(idx):
        batch = data.gather(idx, pad_id, multiple)
        batch["weights"] = np.ones(len(idx), np.float32)
        return batch
    return {"input_ids": np.full((1, 1), pad_id, np.int64),
            "attention_mask": np.ones((1, 1), np.int64),
            "labels": np.zeros(1, np.int64), "weights": np.zeros(1, np.float32)}


def save_checkpoint(directory: Path, model, optimizer, scheduler, scaler, state: dict,
                    final: bool) -> None:
    torch.save(unwrap(model).state_dict(), directory / "model.pt")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict()}, directory / "optim.pt")
    (directory / STATE_FILE).write_text(json.dumps(state))
    if final:
        unwrap(model).save_pretrained(directory / "hf_model", safe_serialization=True)


def load_checkpoint(directory: Path, model, optimizer, scheduler, scaler) -> dict:
    # weights_only=True: a checkpoint never gets to run code on load.
    unwrap(model).load_state_dict(torch.load(directory / "model.pt", map_location="cpu",
                                             weights_only=True))
    optim = torch.load(directory / "optim.pt", map_location="cpu", weights_only=True)
    optimizer.load_state_dict(optim["optimizer"])
    scheduler.load_state_dict(optim["scheduler"])
    scaler.load_state_dict(optim["scaler"])
    return json.loads((directory / STATE_FILE).read_text())


def train_loop_per_worker(config: dict) -> None:
    import ray.train
    import ray.train.torch
    from transformers import get_linear_schedule_with_warmup
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the driver shows progress; workers stay quiet

    cfg = from_dict("train", config["train"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(config["threads"])
    device = ray.train.torch.get_device()
    precision = dev.choose_precision(cfg.precision, device)
    tokens = Path(config["tokens_dir"])
    train_data, val_data = TokenFile(tokens / "train.arrow"), TokenFile(tokens / "validation.arrow")
    pad_id = config["pad_id"]

    torch.manual_seed(cfg.seed)  # identical head init on every rank
    model = load_model(from_dict("model", config["model"]), config["model_source"], config["labels"])
    model = ray.train.torch.prepare_model(model)
    optimizer = build_optimizer(model, cfg)
    steps = total_steps(len(train_data), cfg)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * steps), steps)
    scaler = dev.grad_scaler(device, precision)
    spec = BatchSpec(cfg.global_batch_size, world, cfg.micro_batch_size, cfg.micro_batch_tokens,
                     dev.pad_multiple(cfg.pad_multiple, device), cfg.seed, cfg.pool_batches)

    state = {"epoch": 0, "index": 0, "step": 0, "history": []}
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = load_checkpoint(Path(d), model, optimizer, scheduler, scaler)
    torch.manual_seed(cfg.seed + 7919 * state["step"] + rank)  # dropout differs per rank
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)

    # Per-step values kept on the device until the next report (no host sync inside the step).
    pending, losses, counts = [], [], []
    interval_start, input_wait = time.perf_counter(), 0.0
    for step in iterate_steps(train_data.lengths, spec, rank, state["epoch"], state["index"],
                              cfg.epochs):
        if state["step"] >= steps:
            break
        loss_sum = torch.zeros((), device=device)
        real = padded = rows = 0
        for i, idx in enumerate(step.micro):
            t0 = time.perf_counter()
            host = micro_batch(train_data, idx, pad_id, spec.pad_multiple)
            batch = dev.to_device(host, device)
            input_wait += time.perf_counter() - t0
            real += int(train_data.lengths[idx].sum())
            padded += host["input_ids"].size
            rows += len(idx)
            sync = i == len(step.micro) - 1
            with contextlib.nullcontext() if sync else no_sync():
                with dev.autocast(device, precision):
                    logits = model(input_ids=batch["input_ids"],
                                   attention_mask=batch["attention_mask"]).logits
                ce = F.cross_entropy(logits.float(), batch["labels"], reduction="none")
                # DDP averages gradients over ranks: x world makes the sum over the global batch.
                loss = (ce * batch["weights"]).sum() * world / step.global_rows
                scaler.scale(loss).backward()
            loss_sum += loss.detach()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or float("inf"))
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        state["step"] += 1
        state["epoch"], state["index"] = step.epoch, step.index + 1
        losses.append(torch.stack([loss_sum, grad_norm.detach().float()]))
        counts.append([rows, real, padded])
        pending.append({"step": state["step"], "epoch": step.epoch,
                        "lr": scheduler.get_last_lr()[0]})

        last = state["step"] >= steps
        do_eval = last or (cfg.eval_every and state["step"] % cfg.eval_every == 0)
        do_ckpt = last or (cfg.checkpoint_every and state["step"] % cfg.checkpoint_every == 0)
        if not (last or do_eval or do_ckpt or state["step"] % cfg.report_every == 0):
            continue
        # --- report: one all-reduce for the interval's losses and token counts ---
        values = torch.stack(losses).to(torch.float64)
        local = torch.tensor(counts, dtype=torch.float64, device=device)
        packed = torch.cat([values[:, :1], local], dim=1)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(packed)
        packed, grad_norms = packed.tolist(), values[:, 1].tolist()
        elapsed = time.perf_counter() - interval_start
        for rec, (loss_total, g_rows, g_real, g_padded), gn in zip(pending, packed, grad_norms):
            rec.update({"loss": loss_total / world, "grad_norm": gn, "rows": g_rows,
                        "real_tokens": g_real, "padded_tokens": g_padded})
        local_counts = torch.tensor(counts).sum(0).tolist()
        metrics = {"rank": rank, "records": pending, "interval_s": elapsed,
                   "input_wait_s": input_wait, "local_rows": local_counts[0],
                   "local_real_tokens": local_counts[1], "local_padded_tokens": local_counts[2],
                   "steps_total": steps, "precision": precision.name,
                   "precision_reason": precision.reason, "pad_multiple": spec.pad_multiple,
                   "device": dev.device_name(device), "max_memory_bytes": dev.max_memory_bytes(device)}
        if do_eval:
            metrics["val"] = evaluate_split(model, val_data, spec, rank, device, precision, pad_id)
        state["history"] += [dict(r, **metrics.get("val", {})) if r is pending[-1] else r
                             for r in pending]
        if do_ckpt:
            with tempfile.TemporaryDirectory() as tmp:
                if rank == 0:
                    save_checkpoint(Path(tmp), model, optimizer, scheduler, scaler, state, last)
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp)
                                 if rank == 0 else None)
        else:
            ray.train.report(metrics)
        pending, losses, counts = [], [], []
        interval_start, input_wait = time.perf_counter(), 0.0
