"""What steps a model: optimizer, schedule, scaler, the batch plan and the step's path, built
the same way in-process and on every Ray worker (train/step/loop.py runs it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from wellfed import device as dev
from wellfed.config import TrainConfig
from wellfed.data import shapes
from wellfed.data.batching import BatchSpec, steps_per_epoch
from wellfed.train.step import autobatch, gradients, graphs


@dataclass
class Setup:
    """A model and everything that steps it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    precision: dev.Precision
    spec: BatchSpec
    steps: int
    """Optimizer steps planned for the whole run."""
    device: torch.device
    world: int
    max_grad_norm: float
    task: str = "single_label"
    loss_weights: torch.Tensor | None = None
    """Per-class loss weights on the device (train.class_weights), or None."""
    compiled: torch.nn.Module | None = None
    """torch.compile of `model` (train.compile), which the step runs; None = `model` itself.
    Validation and checkpoints use `model`."""
    budget_note: str = ""
    """How spec.micro_tokens was chosen (set in params, or what the auto probe found)."""
    halvings: int = 0
    """Times a CUDA out-of-memory error halved spec.micro_tokens during the run."""
    graphs: graphs.Graphs | None = None
    """The planned step's buffers and CUDA graphs (train/step/graphs.py); None = the dynamic
    step."""
    path_note: str = ""
    """Why the step takes its path (train.cuda_graphs), and the shape plan if it has one."""


def build_optimizer(model, cfg: TrainConfig, capturable: bool = False):
    """AdamW without decay on biases/norms; the fused kernel where torch has one for the device
    (CPU and CUDA): on this CPU a MiniLM optimizer step took 0.34 s fused vs 1.2 s foreach.
    `capturable` keeps its step counts on the device, as a CUDA graph of the update needs."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim < 2 or "LayerNorm" in name or "norm" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = {"capturable": True} if capturable else {}
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, fused=True, **extra)
    except (RuntimeError, ValueError):  # a device or dtype without a fused kernel
        return torch.optim.AdamW(groups, lr=cfg.lr, **extra)


def total_steps(n_rows: int, cfg: TrainConfig) -> int:
    planned = cfg.epochs * steps_per_epoch(n_rows, cfg.global_batch_size)
    return min(planned, cfg.max_steps) if cfg.max_steps else planned


def setup(cfg: TrainConfig, model, n_rows: int, device: torch.device, world: int = 1,
          task: str = "single_label", loss_weights: torch.Tensor | None = None,
          lengths: np.ndarray | None = None) -> Setup:
    """Optimizer, warmup + linear decay, GradScaler, batch plan and step path for `model`
    (already on its device, DDP-wrapped under Ray), in train mode: from_pretrained returns eval
    mode. `lengths` (the train rows' token counts) is needed by micro_batch_tokens auto, whose
    probe runs at the longest row, and by the shape plan, planned from them."""
    from transformers import get_linear_schedule_with_warmup

    precision = dev.choose_precision(cfg.precision, device)
    path, why = graphs.choose(cfg, device, world)
    model.train()
    optimizer = build_optimizer(model, cfg, capturable=path != "dynamic")
    steps = total_steps(n_rows, cfg)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * steps), steps)
    # A shape plan pads to its own widths: candidates at pad_multiple if set, else any width.
    multiple = (dev.pad_multiple(cfg.pad_multiple, device) if path == "dynamic"
                else cfg.pad_multiple or 1)
    spec = BatchSpec(global_batch=cfg.global_batch_size, world_size=world,
                     micro_rows=cfg.micro_batch_size, micro_tokens=0, pad_multiple=multiple,
                     seed=cfg.seed, pool_batches=cfg.pool_batches)
    planned = None
    if path != "dynamic":
        if lengths is None:
            raise ValueError("the shape plan (train.cuda_graphs) needs the train rows' lengths; "
                             "pass lengths to setup()")
        spec = shapes.plan(lengths, spec, cfg.max_shapes)
        # After the scheduler is made (its base rates stay floats: no step reads one back).
        graphs.use_device_lr(optimizer, device)
    tokens, note = autobatch.choose(cfg.micro_batch_tokens, model, device, precision, lengths,
                                    spec)
    spec = dataclasses.replace(spec, micro_tokens=tokens)
    if path != "dynamic":  # after the probe, which sets the gradients to None
        planned = graphs.create(model, device, capture=path == "graphs",
                                group=planned_group(model, world))
        why = f"{why}; {shapes.describe(lengths, spec)}"
    # dynamic=None is torch.compile's automatic dynamic shapes: the first shape compiles a static
    # graph, the first change of rows or width recompiles once with those sizes symbolic, and
    # later shapes reuse that graph. dynamic=False would compile one graph per (rows, width) up
    # to dynamo's recompile limit (8), then run eager; mark_dynamic by hand needs a call per batch.
    compiled = torch.compile(model, dynamic=None) if cfg.compile else None
    return Setup(model, optimizer, scheduler, dev.grad_scaler(device, precision), precision,
                 spec, steps, device, world, cfg.max_grad_norm, task,
                 None if loss_weights is None else loss_weights.to(device), compiled, note,
                 graphs=planned, path_note=why)


def planned_group(model, world: int):
    """The process group the planned step all-reduces its gradients over (None: no group, one
    worker). It does that itself, so the model must come bare, not DDP-wrapped."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError("the planned step (train.cuda_graphs) all-reduces its own gradients: "
                        "pass setup() the model without DistributedDataParallel")
    group = gradients.default_group()
    size = torch.distributed.get_world_size(group) if group is not None else 1
    if size != world:
        raise ValueError(f"setup(world={world}) but the process group has {size} rank(s): "
                         "initialise torch.distributed with every worker first")
    return group


def learning_rate(s: Setup) -> float:
    """The learning rate of the step just taken, on the host (the optimizer's own may be a
    device tensor: reading it would wait for the GPU)."""
    sched = s.scheduler
    if hasattr(sched, "lr_lambdas"):  # LambdaLR: warmup + linear decay
        return float(sched.base_lrs[0]) * sched.lr_lambdas[0](sched.last_epoch)
    return float(sched.get_last_lr()[0])


def run_facts(s: Setup) -> dict:
    """The token budget in use and how it came about (a halving changes it), and the step's
    path, for every report."""
    note = s.budget_note + (f"; halved {s.halvings}x after CUDA out-of-memory errors"
                            if s.halvings else "")
    return {"micro_batch_tokens": s.spec.micro_tokens, "micro_batch_tokens_source": note,
            "compiled": s.compiled is not None, **graphs.facts(s.graphs, s.path_note)}
