"""Loader throughput: padded torch batches/s from wellfed's token file vs a `datasets` folder.

Both sides hold the same SST-2 train rows (wellfed's token ids, max_length 128) and produce the
same padded batches (input_ids, attention_mask, labels as torch tensors):
  wellfed   TokenFile (memory-mapped Arrow) .gather(idx) -> torch.from_numpy
  datasets  save_to_disk / load_from_disk, ds[idx] (columnar) -> list of row dicts (what
            Dataset.__getitems__ hands a DataLoader) -> DataCollatorWithPadding, as Trainer does.
The datasets folder holds only input_ids and label (the collator builds attention_mask), the
least work it can be given. Two batch plans, each fed identically to both sides:
  random    64-row batches of a seeded permutation (one epoch: 1,053 batches)
  bucketed  wellfed's own length-bucketed 64-row batches (iterate_steps)
Each (side, plan) runs ROUNDS epochs, interleaved A B B A; the median epoch is reported.
Target: wellfed >= 5x datasets batches/s (on each plan).

usage: python benchmarks/loader.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import harness

NAME = "loader"
BATCH = 64
SEED = 42
ROUNDS = 4  # epochs per (side, plan), in A B B A order: ~0.1 s (wellfed) / ~1 s (datasets) each
TARGET = 5.0


def wellfed_epoch(data, batches, pad_id) -> int:
    import torch

    rows = 0
    for idx in batches:
        batch = {k: torch.from_numpy(v) for k, v in data.gather(idx, pad_id).items()}
        rows += batch["input_ids"].shape[0]
    return rows


def datasets_epoch(ds, batches, collator) -> int:
    rows = 0
    for idx in batches:
        columns = ds[idx.tolist()]
        features = [dict(zip(columns, values)) for values in zip(*columns.values())]
        batch = collator(features)
        rows += batch["input_ids"].shape[0]
    return rows


def main() -> None:
    harness.require_sst2(NAME)
    clock = harness.Clock()
    import datasets
    import torch
    from transformers import AutoTokenizer, DataCollatorWithPadding
    from wellfed.data.batching import BatchSpec, iterate_steps
    from wellfed.data.token_files import TokenFile, write_token_file
    from wellfed.data.tokenization import SplitTokenizer

    torch.set_num_threads(harness.THREADS)
    datasets.disable_progress_bars()
    texts, labels = harness.read_sst2("train")
    tokenizer = AutoTokenizer.from_pretrained(harness.model_path())
    pad_id = tokenizer.pad_token_id

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        parquet = harness.write_parquet(tmp / "train.parquet", texts, labels)
        encoder = SplitTokenizer(tokenizer, 128, 8192)
        write_token_file(tmp / "train.arrow", encoder.batches(str(parquet), "train"))
        t0 = time.perf_counter()
        data = TokenFile(tmp / "train.arrow")
        open_wellfed = time.perf_counter() - t0

        ids = [data.row(i).tolist() for i in range(len(data))]  # the very same token ids
        datasets.Dataset.from_dict({"input_ids": ids, "label": data.labels.tolist()}).save_to_disk(
            str(tmp / "train_ds"))
        del ids
        t0 = time.perf_counter()
        ds = datasets.load_from_disk(str(tmp / "train_ds"))
        open_datasets = time.perf_counter() - t0
        collator = DataCollatorWithPadding(tokenizer)

        order = np.random.default_rng(SEED).permutation(len(data))
        spec = BatchSpec(global_batch=BATCH, micro_rows=BATCH, seed=SEED)
        plans = {"random": [order[i:i + BATCH] for i in range(0, len(order), BATCH)],
                 "bucketed": [m for s in iterate_steps(data.lengths, spec, 0) for m in s.micro]}

        # Same output check: one batch from each side must be identical.
        probe = plans["random"][0]
        ours = data.gather(probe, pad_id)
        columns = ds[probe.tolist()]
        theirs = collator([dict(zip(columns, v)) for v in zip(*columns.values())])
        same = all(np.array_equal(ours[k], theirs[k].numpy()) for k in ("input_ids", "attention_mask", "labels"))

        sides = {"wellfed": lambda b: wellfed_epoch(data, b, pad_id),
                 "datasets": lambda b: datasets_epoch(ds, b, collator)}
        times = {(s, p): [] for s in sides for p in plans}
        for r in range(ROUNDS):
            order_of_sides = ["wellfed", "datasets"] if r % 2 == 0 else ["datasets", "wellfed"]
            for plan, batches in plans.items():
                for side in order_of_sides:
                    t0 = time.perf_counter()
                    rows = sides[side](batches)
                    times[(side, plan)].append(time.perf_counter() - t0)
                    if rows != len(data):
                        raise RuntimeError(f"{side}/{plan} produced {rows} rows, expected {len(data)}")
            print(f"[bench] loader: round {r + 1}/{ROUNDS} done")

    contenders, ratios = {}, {}
    for plan, batches in plans.items():
        for side in sides:
            sec = statistics.median(times[(side, plan)])
            contenders[f"{side}_{plan}"] = {
                "batches_per_s": round(len(batches) / sec, 1), "rows_per_s": round(len(data) / sec),
                "epoch_s_median": round(sec, 4), "epoch_s_all": [round(t, 4) for t in times[(side, plan)]],
                "batches": len(batches)}
        ratios[f"wellfed_vs_datasets_{plan}"] = harness.ratio(
            contenders[f"wellfed_{plan}"]["batches_per_s"] / contenders[f"datasets_{plan}"]["batches_per_s"],
            TARGET, of=f"wellfed_{plan} batches/s", over=f"datasets_{plan} batches/s")
    for name, c in contenders.items():
        print(f"[bench]   {name:20s} {c['batches_per_s']:>10,.0f} batches/s {c['rows_per_s']:>10,} rows/s")
    harness.write_result(NAME, {
        "what": "padded torch batches/s and rows/s over one epoch of SST-2 train, 64-row batches",
        "config": {"rows": len(data), "batch": BATCH, "rounds": ROUNDS, "seed": SEED,
                   "datasets_columns": ["input_ids", "label"], "collator": "DataCollatorWithPadding (pt)",
                   "identical_batches": bool(same)},
        "open_s": {"wellfed_TokenFile": round(open_wellfed, 4),
                   "datasets_load_from_disk": round(open_datasets, 4)},
        "contenders": contenders, "ratios": ratios,
        "all_met": all(r["met"] for r in ratios.values()),
        "machine": harness.machine(), **clock.summary()})


if __name__ == "__main__":
    main()
