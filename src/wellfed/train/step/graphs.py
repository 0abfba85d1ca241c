"""The planned step: micro-batches of the shape plan's few shapes (data/shapes.py) run through
static buffers, and on a CUDA GPU replayed as CUDA graphs.

Eager, a BERT-base step on an H100 cost ~45 ms whatever its rows: 7.4 ms of kernels, the rest
Python launching 1,141 of them one by one. Here each shape's forward, loss and backward (into
the parameters' gradients, which stay allocated and are added to in place) is one graph, and
the update (clipping, AdamW with its learning rate read from a device tensor, zeroing the
gradients) another, so a step is a few graph launches. The first micro-batch of a shape runs
eagerly (its warm-up: lazy initialisation, attention plans) on the capture stream; the next one
of that shape is captured and replayed; the update is captured at the second step. Every
micro-batch is computed once, eager or replayed, by the same function: a run that cannot
capture (a capture error, a CPU) runs the same plan eagerly and learns the same.

Under several workers the micro-batch graphs hold no communication: the update graph begins
with one all-reduce of the flat gradient buffer (train/step/gradients.py, which says why not DDP),
and every rank captures it at the same step or none keeps it.

Graphs share one memory pool and are replayed in any order: each writes only temporaries of its
own there and its results into tensors allocated outside the pool (gradients, the loss sum, the
norm), which the step copies out before the next replay. Dropout stays on: the CUDA generator
is registered with every capture, so each replay draws fresh masks.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from wellfed import device as dev
from wellfed import tasks
from wellfed.config import TrainConfig
from wellfed.train.checkpoints.checkpoint import unwrap
from wellfed.train.step import gradients


def choose(cfg: TrainConfig, device: torch.device, world: int) -> tuple[str, str]:
    """("graphs" | "planned" | "dynamic", why) for `train.cuda_graphs` on this device.
    graphs = the shape plan, captured; planned = the shape plan, eager; dynamic = per-batch
    widths, eager (the CPU's fastest path: less padding and unmasked attention on full rows)."""
    if cfg.cuda_graphs == "false":
        return "dynamic", "train.cuda_graphs false"
    if cfg.compile:  # config refuses cuda_graphs true with compile
        return "dynamic", "train.compile is on (it shapes its own graphs)"
    if device.type != "cuda":
        if cfg.cuda_graphs == "true":
            return "planned", "cuda_graphs true on a CPU: the shape plan runs eagerly"
        return "dynamic", ("auto: CPU, where per-batch widths pad less and the host launches "
                           "kernels faster than it computes them")
    if world > 1:
        return "graphs", (f"{cfg.cuda_graphs}: CUDA, {world} workers (gradients all-reduced "
                          "once per step inside the update graph)")
    return "graphs", f"{cfg.cuda_graphs}: CUDA, one worker"


@dataclass
class Graphs:
    """A run's static buffers, graphs and their counts."""

    capture: bool
    """Capture and replay (CUDA, no capture has failed); else run eagerly."""
    full_mask: bool
    """Pass the attention mask as a prepared 4-D boolean mask (transformers uses it as it is,
    without reading it on the host to see whether it could be dropped: a sync per forward)."""
    loss: torch.Tensor
    """The step's loss so far (a device scalar the micro-batches add to)."""
    scale: torch.Tensor
    """world / rows of the global batch: normalises the summed row losses."""
    norm: torch.Tensor
    """The last update's gradient norm."""
    stream: torch.cuda.Stream | None = None
    buffers: dict = field(default_factory=dict)
    """(rows, width) -> the device tensors each micro-batch of that shape is copied into."""
    micro: dict = field(default_factory=dict)
    """(rows, width) -> the captured forward + backward of that shape."""
    warm: set = field(default_factory=set)
    flat: gradients.FlatGradients | None = None
    """The gradients as views of flat buffers and the group they are all-reduced over; None =
    the model's own gradients, one worker."""
    update: torch.cuda.CUDAGraph | None = None
    updates: int = 0
    update_at: int = 1
    """The update is captured when `updates` equals this: at the second step, once AdamW has
    made its state (its first step allocates it); at the next one after a reset."""
    pool: object = None
    capture_s: float = 0.0
    replays: int = 0
    eager: int = 0
    failed: str = ""


def create(model, device: torch.device, capture: bool, group=None) -> Graphs:
    """The buffers of `model`'s planned step; `group` (a process group, or None) is what its
    gradients are all-reduced over. Binds the gradients to flat buffers (gradients.bind), so
    nothing may set them to None afterwards."""
    zeros = {name: torch.zeros((), device=device) for name in ("loss", "scale", "norm")}
    return Graphs(capture=capture, full_mask=takes_4d_mask(model, device),
                  stream=torch.cuda.Stream(device) if capture else None,
                  flat=gradients.bind(model, group), **zeros)


def takes_4d_mask(model, device: torch.device) -> bool:
    """Whether the model gives the same logits with the mask as a (rows, 1, 1, width) boolean
    tensor as with the usual (rows, width) one (encoders under SDPA do; a decoder needs its
    causal mask built, an eager attention an additive one): two rows of 8 tokens, the second
    padded, in eval mode (no dropout, no random draw)."""
    bare = unwrap(model)
    ids = torch.full((2, 8), 5, dtype=torch.long, device=device)
    mask = torch.ones((2, 8), dtype=torch.long, device=device)
    mask[1, 5:] = 0
    was_training = bare.training
    bare.eval()
    try:
        with torch.no_grad():
            flat = bare(input_ids=ids, attention_mask=mask).logits.float()
            full = bare(input_ids=ids, attention_mask=mask.bool()[:, None, None, :]).logits.float()
        return bool(torch.allclose(flat, full, rtol=1e-4, atol=1e-5))
    except Exception:  # a model that refuses a 4-D mask takes the 2-D one
        return False
    finally:
        bare.train(was_training)


def use_device_lr(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Each parameter group's learning rate as a device tensor, which a captured update reads
    at every replay; the LR scheduler fills it in place (its base rates were floats when it was
    made, so no step reads a tensor back to the host). Again after a checkpoint is loaded."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        value = float(lr) if not isinstance(lr, torch.Tensor) else float(lr.detach().cpu())
        group["lr"] = torch.tensor(value, dtype=torch.float32, device=device)


def load(g: Graphs, host: dict, device: torch.device) -> tuple[tuple[int, int], dict]:
    """Copy a host micro-batch into its shape's static buffers (pinned, non-blocking on CUDA)."""
    key = tuple(host["input_ids"].shape)
    buffers = g.buffers.get(key)
    if buffers is None:
        buffers = g.buffers[key] = {k: torch.empty(np.shape(v), dtype=torch.as_tensor(v).dtype,
                                                   device=device) for k, v in host.items()}
    for name, value in host.items():
        tensor = torch.as_tensor(value)
        if device.type == "cuda" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        buffers[name].copy_(tensor, non_blocking=True)
    return key, buffers


def forward_backward(s, buffers: dict) -> None:
    """One micro-batch: forward under autocast, row losses weighted (filler rows weigh 0) and
    normalised by the global batch's rows, backward into the gradients, loss added to the sum.
    The same function runs eagerly, as a warm-up and under capture; through s.compiled where
    train/step/fusion.py compiled the model per shape."""
    g = s.graphs
    model = s.model if s.compiled is None else s.compiled
    with dev.autocast(s.device, s.precision, cache=False):
        logits = dev.forward_planned(model, buffers, g.full_mask)
    rows = tasks.row_loss(s.task, logits, buffers["labels"], s.loss_weights)
    loss = (rows * buffers["weights"]).sum() * g.scale
    s.scaler.scale(loss).backward()
    g.loss.add_(loss.detach())


def run(s, key: tuple[int, int], buffers: dict) -> None:
    """Replay the shape's graph; capture it at its second micro-batch; else run it eagerly."""
    g = s.graphs
    if key in g.micro:
        g.micro[key].replay()
        g.replays += 1
        return
    if g.capture and key in g.warm:
        graph = captured(g, lambda: forward_backward(s, buffers))
        if graph is not None:
            g.micro[key] = graph
            graph.replay()
            g.replays += 1
            return
    with side_stream(g):
        forward_backward(s, buffers)
    g.warm.add(key)
    g.eager += 1


@contextlib.contextmanager
def side_stream(g: Graphs):
    """Warm-up runs on the capture stream (as PyTorch's CUDA graph guide does it), ordered after
    and before the current stream's work; a no-op when not capturing."""
    if g.stream is None or not g.capture:
        yield
        return
    current = torch.cuda.current_stream()
    g.stream.wait_stream(current)
    try:
        with torch.cuda.stream(g.stream):
            yield
    finally:  # an out-of-memory error too: later work waits for what was queued there
        current.wait_stream(g.stream)


def captured(g: Graphs, work) -> torch.cuda.CUDAGraph | None:
    """`work` captured as a graph in the run's pool, or None after a failure (recorded once,
    and the run goes on eagerly: the same work, the same learning, launched from Python)."""
    start = time.perf_counter()
    graph = torch.cuda.CUDAGraph()
    try:
        # thread_local: a loader's pin-memory thread may allocate host memory meanwhile.
        with torch.cuda.graph(graph, pool=g.pool, stream=g.stream,
                              capture_error_mode="thread_local"):
            work()
    except Exception as err:  # noqa: BLE001 - any capture failure falls back to eager
        rng_out_of_capture()
        g.capture, g.failed = False, f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        # A captured update stays: it draws no random numbers and its tensors stay allocated,
        # and under several workers every rank must go on replaying its captured all-reduce.
        g.micro.clear()
        print(f"[wellfed] WARNING: CUDA graph capture failed ({g.failed}); the run continues "
              "eagerly with the same shapes (set train.cuda_graphs: false to skip capturing)",
              flush=True)
        return None
    if g.pool is None:
        g.pool = graph.pool()
    g.capture_s += time.perf_counter() - start
    return graph


def rng_out_of_capture() -> None:
    """A capture that failed half-way leaves the CUDA generator marked as capturing (seen on an
    H200: the next dropout raised "Offset increment outside graph capture encountered
    unexpectedly"); it gets a copy of its state (same seed and offset) that is not."""
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    generator.graphsafe_set_state(generator.clone_state())


def accumulate(s, step, batches, meter, lengths: np.ndarray) -> torch.Tensor:
    """The planned step's forward and backward over this rank's micro-batches of `step`;
    returns the step's loss, still on the device."""
    g = s.graphs
    g.scale.fill_(s.world / step.global_rows)  # a fill kernel: no host sync
    rows_n = real = padded = 0
    for idx in step.micro:
        with meter.waiting():
            host = next(batches)
        with meter.copying():
            key, buffers = load(g, host, s.device)
        rows_n, real = rows_n + len(idx), real + int(lengths[idx].sum())
        padded += key[0] * key[1]
        with meter.computing():
            run(s, key, buffers)
    meter.count(rows_n, real, padded)
    loss = g.loss.clone()
    g.loss.zero_()
    return loss


def update(s, meter, eager_update) -> tuple[torch.Tensor, torch.Tensor]:
    """All-reduce the gradients (several workers), clip, step and zero them (kept allocated):
    replayed once captured at step `update_at`; fp16's GradScaler (which reads its overflow
    flag on the host) always runs eagerly. Returns (gradient norm, skipped flag) as fresh
    device tensors."""
    g = s.graphs

    def reduce_and_update():
        gradients.all_reduce(g.flat)
        return eager_update(s, set_to_none=False)

    with meter.computing():
        if g.update is None and g.updates == g.update_at and not s.scaler.is_enabled():
            # Every rank reaches this step. Under a group, a rank captures only if every rank is
            # still capturing (a failed micro-batch capture stops one rank's), and keeps its
            # capture only if every rank made one: NCCL wants a captured collective captured
            # on all of its ranks. Without one, agree() returns what it is given.
            go = gradients.agree(g.flat, g.capture) if g.flat is not None else g.capture
            graph = captured(g, lambda: g.norm.copy_(reduce_and_update()[0])) if go else None
            if g.flat is not None and not gradients.agree(g.flat, graph is not None):
                graph = None
            g.update = graph
        if g.update is not None:
            g.update.replay()
            skipped = 0.0
        else:
            norm, skipped = reduce_and_update()
            g.norm.copy_(norm)
        g.updates += 1
        s.scheduler.step()
    return g.norm.clone(), torch.full((), skipped, device=s.device)


def reset(g: Graphs) -> None:
    """After an out-of-memory error halved the token budget: the shapes change, so every graph,
    buffer and warm-up goes (and the pool's memory with them) and the loss sum restarts."""
    g.micro.clear()
    g.buffers.clear()
    g.warm.clear()
    g.update, g.pool = None, None
    g.update_at = max(g.updates, 1)  # the next update is captured again, AdamW's state made
    g.loss.zero_()


def facts(g: Graphs | None, why: str) -> dict:
    """What ran, for every report: the path and why (`derived`: MLflow tags), and the graphs'
    counts and capture time so far (the tracking side logs them as workers/* metrics)."""
    if g is None:
        return {"derived": {"step_path": "dynamic", "step_path_reason": why}}
    path = "cuda_graphs" if g.capture else "planned_eager"
    if g.failed:
        why = f"capture failed ({g.failed})"
    return {"derived": {"step_path": path, "step_path_reason": why},
            "graphs_captured": len(g.micro) + (g.update is not None),
            "graph_capture_s": round(g.capture_s, 3), "graph_replays": g.replays,
            "eager_micro_batches": g.eager}
