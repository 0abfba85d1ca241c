"""Fused trials on a GPU: K trials of one model as one (train/trials/) against one trial alone,
bf16, needing only torch and transformers (Ray, MLflow and DVC cannot travel to a lent device).

Models are random-init from a config (throughput does not depend on the weights): MiniLM's
(6 layers x 384) at K = 1, 4, 8, 16 and BERT-base's (12 x 768) at K = 1, 2, 4. Batches are
32 rows of SST-2-like lengths (8-64 tokens, seeded), padded to the batch's longest row, the same
batches for every contender. Per model:
  alone  the plain transformers model with torch.optim.AdamW (fused kernel) and the HF
         schedule, a step = forward + backward + clip + update: what one search trial runs
  fused  K trials as one TrialModel + TrialAdamW, the learning rates spread over 2e-5..2e-4
Figure: real (non-pad) tokens/s of the group against one trial alone, i.e. how many trials'
worth of work the group does in one trial's time (the target: >= 0.6 K for MiniLM up to K = 8,
>= 5 at K = 8; >= 2 for BERT-base at K = 4), timed over STEPS steps after WARMUP, synchronised;
the peak memory of each. Equal learning in bf16: trial 0 of the fused group at K = 4 against
the same trial alone, the same seed, batches and dropout: largest relative gap of the per-step
losses over STEPS steps (stated tolerance 2e-2: bf16 keeps 8 bits of mantissa, and the batched
matmuls round in another order).
Across seeds (the final check's groups, train/trials/apart.py), MiniLM at K = 4 and 8: each trial
its own batches (its own seeded lengths) and dropout stream, the group's micro-batch the trials'
own stacked and padded to one shape: real tokens/s of all trials against one trial alone, the
tokens computed over those the trials compute alone (the padding), and trial 0 (the batches and
dropout seed of the trial alone) against the trial alone, as above. And where a fused step's time
goes at each model's largest K (forward and backward, clipping, the update; synchronised at each
boundary, in a run of its own).

WELLFED_BENCH_SMOKE=1: tiny models on the CPU, K in 1, 2 (a check of this script, no figures).
usage (device): PYTHONPATH=src python benchmarks/gpu_fused_trials.py  -> $OUT or
benchmarks/results/gpu/gpu_fused_trials.json
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SMOKE = os.environ.get("WELLFED_BENCH_SMOKE") == "1"
STEPS, WARMUP = (3, 1) if SMOKE else (30, 5)
MODELS = {"minilm": (dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12,
                          intermediate_size=1536), (1, 4, 8, 16)),
          "bert-base": (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                             intermediate_size=3072), (1, 2, 4))}
if SMOKE:
    MODELS = {"tiny": (dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                            intermediate_size=64), (1, 2))}


def batches(n: int, device, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lens = torch.randint(8, 65, (32,), generator=g)
        width = int(lens.max())
        ids = torch.randint(1000, 20000, (32, width), generator=g)
        mask = (torch.arange(width)[None] < lens[:, None]).long()
        out.append({"input_ids": (ids * mask).to(device), "attention_mask": mask.to(device),
                    "labels": torch.randint(0, 2, (32,), generator=g).to(device),
                    "real": int(lens.sum())})
    return out


def model(dims: dict, device, seed: int = 0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, num_labels=2, attn_implementation="sdpa", **dims)
    return BertForSequenceClassification(config).to(device).train()


def run_alone(dims, data, device, lr=1e-4):
    from transformers import get_linear_schedule_with_warmup

    m = model(dims, device)
    decay = [p for n, p in m.named_parameters() if p.ndim >= 2 and "norm" not in n.lower()]
    rest = [p for n, p in m.named_parameters() if not (p.ndim >= 2 and "norm" not in n.lower())]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": rest, "weight_decay": 0.0}], lr=lr,
                            fused=device.type == "cuda")
    sched = get_linear_schedule_with_warmup(opt, 2, len(data))
    torch.manual_seed(1)
    losses, start = [], None
    for i, b in enumerate(data):
        if i == WARMUP:
            sync(device)
            start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        loss = torch.nn.functional.cross_entropy(logits.float(), b["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    sync(device)
    return time.perf_counter() - start, [float(v) for v in losses]


def run_fused(dims, data, device, k, phases=None):
    from wellfed.train.trials.layers import TrialModel
    from wellfed.train.trials.update import Recipe, TrialAdamW

    fused = TrialModel(model(dims, device), k).to(device).train()
    lrs = [1e-4] if k == 1 else [2e-5 * (10 ** (i / (k - 1))) for i in range(k)]
    lrs[0] = 1e-4  # trial 0: the recipe alone trains
    opt = TrialAdamW(list(fused.named_parameters()), [Recipe(lr, 0.01, 2 / len(data), 1.0)
                                                      for lr in lrs], len(data))
    torch.manual_seed(1)
    losses, start = [], None
    for i, b in enumerate(data):
        if i == WARMUP:
            sync(device)
            start = time.perf_counter()
        marks = [time.perf_counter()]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = fused(b["input_ids"], b["attention_mask"])
        loss = torch.stack([torch.nn.functional.cross_entropy(logits[t].float(), b["labels"])
                            for t in range(k)])
        loss.sum().backward()
        if phases is not None:  # where a step's time goes: synchronised at each boundary
            sync(device)
            marks.append(time.perf_counter())
        opt.clip()
        if phases is not None:
            sync(device)
            marks.append(time.perf_counter())
        opt.step()
        opt.zero_grad()
        if phases is not None and i >= WARMUP:
            sync(device)
            marks.append(time.perf_counter())
            for name, a, b_ in zip(("forward_backward", "clip", "update"), marks, marks[1:]):
                phases[name] = phases.get(name, 0.0) + (b_ - a) / STEPS
        losses.append(loss.detach()[0])
    sync(device)
    return time.perf_counter() - start, [float(v) for v in losses]


def run_apart(dims, data, device, k):
    """K trials, trial t on `data[t]` (its own batches) with its own dropout stream (trial 0:
    the alone run's seed 1), their micro-batches stacked to one shape per step."""
    import numpy as np

    from wellfed.train.trials.apart import Streams, stacked
    from wellfed.train.trials.layers import TrialModel
    from wellfed.train.trials.update import Recipe, TrialAdamW

    fused = TrialModel(model(dims, device), k).to(device).train()
    fused.streams = Streams.seeded([1 + t for t in range(k)], device)
    lrs = [1e-4] + [2e-5 * (10 ** (i / max(1, k - 2))) for i in range(k - 1)]
    opt = TrialAdamW(list(fused.named_parameters()), [Recipe(lr, 0.01, 2 / len(data[0]), 1.0)
                                                      for lr in lrs], len(data[0]))
    hosts = [[{key: v.cpu().numpy() for key, v in b.items() if key != "real"}
              | {"weights": np.ones(len(b["labels"]), np.float32)} for b in trial]
             for trial in data]
    losses, start, computed, alone = [], None, 0, 0
    for i in range(len(data[0])):
        if i == WARMUP:
            sync(device)
            start = time.perf_counter()
            computed = alone = 0
        host, own, masked = stacked([h[i] for h in hosts], 0)
        computed += host["input_ids"].size
        alone += sum(r * w for r, w in own)
        b = {key: torch.from_numpy(v).to(device, non_blocking=True) for key, v in host.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = fused(b["input_ids"], b["attention_mask"], own=own, masked=masked)
        labels = b["labels"].reshape(k, -1)
        loss = torch.stack([torch.nn.functional.cross_entropy(logits[t].float(), labels[t])
                            for t in range(k)])
        loss.sum().backward()
        opt.clip()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach()[0])
    sync(device)
    return time.perf_counter() - start, [float(v) for v in losses], computed / alone


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak(device) -> float | None:
    if device.type != "cuda":
        return None
    value = torch.cuda.max_memory_allocated(device) / 2 ** 30
    torch.cuda.reset_peak_memory_stats(device)
    return round(value, 2)


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() and not SMOKE else "cpu")
    data = batches(WARMUP + STEPS, device)
    real = sum(b["real"] for b in data[WARMUP:])
    result = {"benchmark": "gpu_fused_trials", "device": torch.cuda.get_device_name(device)
              if device.type == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "steps": STEPS, "warmup": WARMUP, "models": {}}
    started = time.perf_counter()
    for name, (dims, ks) in MODELS.items():
        seconds, alone_losses = run_alone(dims, data, device)
        one = real / seconds
        rows = {"alone_tokens_per_s": round(one), "alone_peak_gib": peak(device), "fused": []}
        for k in ks:
            seconds, losses = run_fused(dims, data, device, k)
            rows["fused"].append({"k": k, "tokens_per_s": round(k * real / seconds),
                                  "trials_worth": round(k * real / seconds / one, 2),
                                  "peak_gib": peak(device)})
            if k == ks[min(2, len(ks) - 1)]:
                rows["equal_learning"] = {"k": k, "largest_relative_gap": max(
                    abs(a - b) / max(abs(a), abs(b)) for a, b in zip(losses, alone_losses)),
                    "tolerance": 2e-2}
            print(f"[gpu] {name} K={k}: {rows['fused'][-1]['trials_worth']}x one trial's "
                  f"tokens/s", flush=True)
        result["models"][name] = rows
        phases: dict = {}
        run_fused(dims, data, device, ks[-1], phases)
        rows["step_phases_s"] = {"k": ks[-1], **{n: round(v, 5) for n, v in phases.items()}}
        print(f"[gpu] {name} K={ks[-1]} a step's phases (s): {rows['step_phases_s']}", flush=True)
        if name in ("minilm", "tiny"):
            rows["across_seeds"] = []
            for k in ((2,) if SMOKE else (4, 8)):
                own = [data] + [batches(WARMUP + STEPS, device, seed=t) for t in range(1, k)]
                seconds, losses, padding = run_apart(dims, own, device, k)
                real_all = sum(b["real"] for trial in own for b in trial[WARMUP:])
                rows["across_seeds"].append({
                    "k": k, "tokens_per_s": round(real_all / seconds),
                    "trials_worth": round(real_all / seconds / one, 2),
                    "tokens_computed_over_alone": round(padding, 3), "peak_gib": peak(device),
                    "equal_learning_trial0": max(abs(a - b) / max(abs(a), abs(b))
                                                 for a, b in zip(losses, alone_losses))})
                print(f"[gpu] {name} across seeds K={k}: "
                      f"{rows['across_seeds'][-1]['trials_worth']}x one trial's tokens/s, "
                      f"padding {padding:.3f}x", flush=True)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    out = Path(os.environ.get("OUT") or Path(__file__).parent / "results" / "gpu")
    if SMOKE:
        print(json.dumps(result, indent=1))
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_fused_trials.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
