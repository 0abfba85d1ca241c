"""Fused trials against the same trials trained one by one, on this CPU (fp32, 2 threads).

K recipes of all-MiniLM-L6-v2 (pretrained, as a search starts) on the first ROWS SST-2 train
rows (validation: the first VAL SST-2 dev rows), global batch 32, STEPS optimizer steps each,
learning rates spread log-uniformly over 2e-5..2e-4 (weight decay 0.01, warmup 6%):
  alone  the K trials one after another, each through wellfed's ordinary loop (train/step/loop.py,
         what a search trial runs), validating at its end
  fused  the K trials as one group (train/trials/group.py), one fused validation at the end
For K in KS, in the order alone, fused, fused, alone (drift on this shared machine then
favours neither side). Figures per K: the steps' seconds (each side's own step timer, so model
loads sit outside: they are reported beside it) and the whole wall including loads and
validation, both as fused / alone throughput (K x the trial-steps in the same time); equal
learning: every trial's per-step losses fused against alone (largest relative gap).

WELLFED_BENCH_APART=1: the final check's case, each trial its own seed (1..K: its own data order,
dropout and head init, train/trials/apart.py), where the group pads its trials' own batches to one
shape; the padding is reported as the tokens computed fused over those computed alone
(-> fused_trials_apart.json).

WELLFED_BENCH_STEPS and WELLFED_BENCH_KS (e.g. 8 and 1,4) shorten it on a busy machine (the
JSON says what ran). WELLFED_BENCH_SMOKE=1: a tiny random-init model, 64 rows, 3 steps, K in 1, 2 (a check of this
script, no figures).

usage: python benchmarks/fused_trials.py  -> benchmarks/results/fused_trials.json
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import harness

APART = os.environ.get("WELLFED_BENCH_APART") == "1"
NAME = "fused_trials_apart" if APART else "fused_trials"
SMOKE = os.environ.get("WELLFED_BENCH_SMOKE") == "1"
ROWS, VAL, STEPS, KS = (64, 32, 3, (1, 2)) if SMOKE else (1024, 256, 24, (1, 2, 4))
STEPS = int(os.environ.get("WELLFED_BENCH_STEPS", STEPS))
KS = tuple(int(k) for k in os.environ.get("WELLFED_BENCH_KS", ",".join(map(str, KS))).split(","))


def token_dir(root: Path, tokenizer) -> Path:
    from wellfed.data.token_files import write_token_file
    from wellfed.data.tokenization import SplitTokenizer

    root.mkdir(parents=True, exist_ok=True)
    for split, source, rows in (("train", "train", ROWS), ("validation", "dev", VAL)):
        texts, labels = harness.read_sst2(source)
        parquet = harness.write_parquet(root / f"{split}.parquet", texts[:rows], labels[:rows])
        write_token_file(root / f"{split}.arrow",
                         SplitTokenizer(tokenizer, 128, 8192).batches(str(parquet), split))
    return root


def recipes(k: int, base):
    lrs = np.geomspace(2e-5, 2e-4, k) if k > 1 else [1e-4]
    return [dataclasses.replace(base, lr=float(f"{lr:.4g}"), seed=base.seed + i if APART
                                else base.seed) for i, lr in enumerate(lrs)]


def alone(job, configs, place) -> dict:
    from wellfed.train.step.loop import train

    started, steps_s, losses = time.perf_counter(), 0.0, []
    for cfg in configs:
        got = []
        train(dataclasses.replace(job, train=cfg), place, lambda m, _c: got.append(m),
              validate_at=frozenset(), checkpoints=False)
        steps_s += got[-1]["timing"].get("steps", 0.0)
        losses.append([r["loss"] for m in got for r in m["records"]])
    return {"steps_s": steps_s, "wall_s": time.perf_counter() - started, "losses": losses}


def fused(job, configs, place) -> dict:
    from wellfed.train.trials.group import train_group

    started = time.perf_counter()
    run = train_group(job, configs, place)
    return {"steps_s": run.seconds["steps"], "wall_s": time.perf_counter() - started,
            "losses": [[r["loss"] for r in run.history[k]] for k in range(len(configs))],
            "padding": run.tokens["computed"] / run.tokens["alone"]}


def gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) / max(abs(x), abs(y), 1e-12)
               for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def main() -> None:
    import torch
    from transformers import AutoTokenizer

    from wellfed.config import DataConfig, ModelConfig, TrainConfig
    from wellfed.train.step.loop import Place, TrainJob

    harness.require_sst2(NAME)
    clock = harness.Clock()
    torch.set_num_threads(harness.THREADS)
    source = harness.model_path()
    tokenizer = AutoTokenizer.from_pretrained(source)
    base = TrainConfig(epochs=1, max_steps=STEPS, global_batch_size=32, micro_batch_size=32,
                       precision="fp32", seed=1, eval_every=0, report_every=STEPS,
                       checkpoint_every=0)
    model = ModelConfig(init="random" if SMOKE else "pretrained")
    place = Place(torch.device("cpu"))
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        tokens = token_dir(Path(tmp), tokenizer)
        job = TrainJob(base, DataConfig(), model, tokens, source, ("negative", "positive"),
                       int(tokenizer.pad_token_id))
        for k in KS:
            configs = recipes(k, base)
            runs = {"alone": [], "fused": []}
            for side in ("alone", "fused", "fused", "alone"):
                runs[side].append((alone if side == "alone" else fused)(job, configs, place))
                print(f"[bench] K={k} {side}: steps {runs[side][-1]['steps_s']:.1f} s, wall "
                      f"{runs[side][-1]['wall_s']:.1f} s", flush=True)
            a_steps = sum(r["steps_s"] for r in runs["alone"])
            f_steps = sum(r["steps_s"] for r in runs["fused"])
            a_wall = sum(r["wall_s"] for r in runs["alone"])
            f_wall = sum(r["wall_s"] for r in runs["fused"])
            cases.append({
                "trials": k, "steps_each": STEPS,
                "alone_steps_s": [round(r["steps_s"], 2) for r in runs["alone"]],
                "fused_steps_s": [round(r["steps_s"], 2) for r in runs["fused"]],
                "alone_wall_s": [round(r["wall_s"], 2) for r in runs["alone"]],
                "fused_wall_s": [round(r["wall_s"], 2) for r in runs["fused"]],
                "steps_speedup": harness.ratio(a_steps / f_steps, None, of="alone step seconds",
                                               over="fused step seconds"),
                "wall_speedup": harness.ratio(a_wall / f_wall, None, of="alone wall",
                                              over="fused wall"),
                # Load on a shared machine only ever slows a run: the fastest of each side is
                # the figure least bent by it.
                "fastest_steps_speedup": round(min(r["steps_s"] for r in runs["alone"])
                                               / min(r["steps_s"] for r in runs["fused"]), 3),
                "largest_relative_loss_gap": float(f"{gap(runs['fused'][0]['losses'], runs['alone'][0]['losses']):.3g}"),
                "seeds": [c.seed for c in configs],
                "tokens_computed_fused_over_alone": round(runs["fused"][0]["padding"], 3),
            })
            print(f"[bench] K={k}: fused {a_steps / f_steps:.2f}x the steps' throughput of "
                  f"the trials alone, {a_wall / f_wall:.2f}x their wall; largest loss gap "
                  f"{cases[-1]['largest_relative_loss_gap']:.2g}; tokens computed "
                  f"{runs['fused'][0]['padding']:.3f}x alone", flush=True)
    if SMOKE:
        print("[bench] smoke run: no figures written")
        return
    harness.write_result(NAME, {"machine": harness.machine(), **clock.summary(),
                                "rows": ROWS, "validation_rows": VAL, "model": "all-MiniLM-L6-v2",
                                "steps_each": STEPS, "trials": list(KS),
                                "seeds": "each trial its own" if APART else "one for all",
                                "cases": cases})


if __name__ == "__main__":
    main()
