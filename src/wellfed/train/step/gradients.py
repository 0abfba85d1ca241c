"""The planned step's gradients under several workers: every trainable parameter's `.grad` is a
view into one flat buffer (one per device and dtype), and one all-reduce of that buffer at the
start of the update makes them the gradients of the whole global batch.

The planned path runs without DDP (train/step/loop.py wraps only the dynamic step in it). DDP
all-reduces bucket by bucket from hooks inside the backward of a step's last micro-batch and
skips that under `no_sync` for the others; a shape's CUDA graph is captured once and replayed
for every micro-batch of that shape, last or not, so each shape would need two graphs, and
DDP's reducer (buckets rebuilt after the first step, static_graph's bookkeeping) would be frozen
into them. Here the micro-batch graphs hold no communication at all: the update graph begins
with the all-reduce, one collective per step on every rank whatever its count of micro-batches,
captured with clipping and AdamW (NCCL operations can be captured since NCCL 2.9).

The price is overlap: DDP runs its all-reduce while the backward goes on, this one after it.
BERT-base's 109.5M fp32 gradients are 438 MB; a ring all-reduce moves 2(n-1)/n of that per GPU,
so 8 GPUs at a bus bandwidth of 300 GB/s would add ~2.6 ms to each step (arithmetic, not
measured: no machine with several GPUs has run this yet).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class FlatGradients:
    """A model's gradients as views of flat buffers, and the group they are summed over."""

    buffers: list[torch.Tensor] = field(default_factory=list)
    """One zeroed flat buffer per (device, dtype) of the trainable parameters."""
    views: list[torch.Tensor] = field(default_factory=list)
    """Each trainable parameter's `.grad`, in the model's parameter order."""
    group: object = None
    """The process group to all-reduce over; None = one worker, nothing to reduce."""
    world: int = 1

    @property
    def shared(self) -> bool:
        return self.group is not None


def default_group():
    """The run's process group (Ray Train makes one on every worker, one worker included), or
    None when the run has none (in-process training)."""
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def bind(model: torch.nn.Module, group=None) -> FlatGradients:
    """Point every trainable parameter's `.grad` into a flat buffer of its device and dtype
    (what a gradient held before is kept). Autograd then adds each micro-batch's gradient in
    place into the buffer, and `zero_grad(set_to_none=False)` zeroes it in place; setting a
    gradient to None would cut it loose (the planned path never does). With a group of several
    ranks, rank 0's weights are broadcast first, as DDP's constructor does."""
    world = dist.get_world_size(group) if group is not None else 1
    if world > 1:
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor, src=dist.get_global_rank(group, 0), group=group)
    kinds: dict[tuple, list[torch.nn.Parameter]] = {}
    for param in model.parameters():
        if param.requires_grad:
            kinds.setdefault((param.device, param.dtype), []).append(param)
    flat = FlatGradients(group=group, world=world)
    views = {}
    for (device, dtype), params in kinds.items():
        buffer = torch.zeros(sum(p.numel() for p in params), dtype=dtype, device=device)
        offset = 0
        for param in params:
            view = buffer[offset:offset + param.numel()].view_as(param)
            if param.grad is not None:
                view.copy_(param.grad)
            param.grad = views[id(param)] = view
            offset += param.numel()
        flat.buffers.append(buffer)
    flat.views = [views[id(p)] for p in model.parameters() if p.requires_grad]
    return flat


def bound(flat: FlatGradients, model: torch.nn.Module) -> bool:
    """Whether every trainable parameter's `.grad` is still its view into the buffers."""
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    return len(grads) == len(flat.views) and all(
        g is not None and g.data_ptr() == v.data_ptr() for g, v in zip(grads, flat.views))


def all_reduce(flat: FlatGradients | None) -> None:
    """Sum each buffer over the group, then divide by the world size: every rank's loss is
    normalised by the global batch's rows x world (train/step/graphs.py `accumulate`), so the mean
    over ranks is the gradient of the whole global batch's mean loss, as DDP's average gives.
    SUM then a multiply, not ReduceOp.AVG: gloo (the CPU's backend) has no AVG. No host sync:
    a captured update replays it."""
    if flat is None or not flat.shared:
        return
    for buffer in flat.buffers:
        dist.all_reduce(buffer, group=flat.group)
        if flat.world > 1:
            buffer.mul_(1.0 / flat.world)


def agree(flat: FlatGradients, ok: bool) -> bool:
    """Whether `ok` holds on every rank (an all-reduce MIN, read on the host: twice per run, at
    the update's capture). NCCL requires a captured collective to be captured on every rank of
    its communicator, so the ranks capture the update only when all are still capturing, and
    keep it only when all captured theirs."""
    if not flat.shared:
        return ok
    flag = torch.tensor([int(ok)], dtype=torch.int32, device=flat.buffers[0].device
                        if flat.buffers else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=flat.group)
    return bool(flag.item())
