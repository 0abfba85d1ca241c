"""How many trials train as one group: K follows the device, and the choice says why.

- A GPU: one trial's measured peak memory (its weights, gradients and activations at the
  group's widest micro-batch, from one fused forward and backward at K = 1) plus its AdamW
  state, against the free memory with HEADROOM kept back. An out-of-memory error in a group
  halves K and trains it again (search/fused.py).
- A CPU: measured throughput. The same micro-batch's forward and backward alone and at K = 4
  fused; fused only where a trial-step is measurably cheaper (FASTER), else one at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

HEADROOM = 0.15
"""Share of a GPU's free memory not planned for (the allocator's fragmentation, the CUDA
context of other libraries, the validation batches)."""
FASTER = 0.9
"""A CPU group of K must take at most this share of K one-trial steps' time to be chosen."""


@dataclass(frozen=True)
class Choice:
    trials: int
    """K: trials per group."""
    reason: str


def by_memory(wanted: int, free: int, per_trial: int) -> Choice:
    """K on a GPU with `free` bytes free, a trial needing `per_trial` bytes."""
    usable = int(free * (1 - HEADROOM))
    fits = max(1, usable // max(per_trial, 1))
    k = min(wanted, fits)
    return Choice(k, f"{fits} trial(s) of {per_trial / 2**30:.2f} GiB fit in "
                     f"{usable / 2**30:.1f} GiB ({1 - HEADROOM:.0%} of the GPU's free "
                     f"{free / 2**30:.1f} GiB); {wanted} wanted")


def by_throughput(wanted: int, one_s: float, group_s: float, k: int) -> Choice:
    """K on a CPU, from the seconds of a step at K = 1 (`one_s`) and at K = `k` (`group_s`)."""
    share = group_s / (k * one_s)
    if k > 1 and share <= FASTER:
        return Choice(min(wanted, k), f"a step of {k} fused trials took {share:.2f}x the time "
                                      f"of {k} steps alone on this CPU (measured)")
    return Choice(1, f"a step of {k} fused trials took {share:.2f}x the time of {k} steps "
                     f"alone on this CPU (measured; fused only at <= {FASTER}x): one at a time")


def probe_batch(model, rows: int, width: int, pad_id: int, device: torch.device) -> dict:
    ids = torch.full((rows, width), pad_id + 1, dtype=torch.long, device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def step_seconds(model, ks: tuple[int, ...], batch: dict, rounds: int = 3) -> dict[int, float]:
    """Seconds of a forward + backward over `batch` for each k of `ks`: `model` itself at k = 0
    (a trial alone), else k fused trials of it. Each the fastest of `rounds`, the contenders
    taking turns (a busy machine then slows each alike), after one warm-up each."""
    import copy

    from wellfed.train.trials.layers import TrialModel

    device = batch["input_ids"].device
    models = {}
    for k in ks:
        models[k] = copy.deepcopy(model).to(device) if not k else \
            TrialModel(copy.deepcopy(model), k).to(device)
        models[k].train()
    best = {k: float("inf") for k in ks}
    for i in range(rounds + 1):
        for k in ks:
            start = time.perf_counter()
            out = models[k](batch["input_ids"], batch["attention_mask"])
            (out if k else out.logits).float().sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:  # round 0 is the warm-up
                best[k] = min(best[k], time.perf_counter() - start)
            models[k].zero_grad(set_to_none=True)
    return best


def trial_bytes(model, batch: dict) -> int:
    """One trial's peak memory on a GPU: a K = 1 fused forward + backward over `batch`, its
    weights and gradients included, plus AdamW's two moments (8 bytes a float32 weight)."""
    import copy

    from wellfed.train.trials.layers import TrialModel

    device = batch["input_ids"].device
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fused = TrialModel(copy.deepcopy(model), 1).to(device)
    fused.train()
    fused(batch["input_ids"], batch["attention_mask"]).float().sum().backward()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    moments = 2 * sum(p.numel() * p.element_size() for p in fused.parameters())
    del fused
    torch.cuda.empty_cache()
    return peak + moments


def choose(model, wanted: int, rows: int, width: int, pad_id: int,
           device: torch.device) -> Choice:
    """K for `wanted` trials of `model` (on `device`) whose widest micro-batch is `rows` x
    `width` tokens."""
    if wanted <= 1:
        return Choice(1, "one trial")
    batch = probe_batch(model, rows, width, pad_id, device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return by_memory(wanted, free, trial_bytes(model, batch))
    k = min(wanted, 4)  # on a CPU the gain, where there is one, shows by 4
    seconds = step_seconds(model, (0, k), batch)
    return by_throughput(wanted, seconds[0], seconds[k], k)
