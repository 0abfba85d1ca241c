"""Padding efficiency over one epoch of SST-2 train at batch 32: wellfed vs three usual batchings.

padding efficiency = real tokens / tokens computed (rows x padded width, summed over batches).
Contenders, all on the same token lengths (wellfed's tokenizer, max_length 128):
  wellfed        iterate_steps, pool_batches 64, world_size 1, pad_multiple 1 (CPU settings)
  random         shuffled batches of 32, dynamic padding to the batch's longest row
                 (RandomSampler + DataCollatorWithPadding, the Trainer default)
  pad_to_max     every row padded to max_length 128 (padding="max_length")
  length_grouped transformers' LengthGroupedSampler (Trainer's group_by_length), batches of 32
Also reported, not targeted: wellfed with 2 ranks and with pad_multiple 8 (the CUDA setting).
Target: wellfed >= 0.95.

usage: python benchmarks/padding.py
"""

from __future__ import annotations

import numpy as np

import harness

NAME = "padding"
BATCH = 32
MAX_LENGTH = 128
SEED = 42
TARGET = 0.95


def efficiency(lengths: np.ndarray, batches, pad_multiple: int = 1) -> dict:
    real = computed = count = 0
    for idx in batches:
        if len(idx) == 0:
            continue
        width = -(-int(lengths[idx].max()) // pad_multiple) * pad_multiple
        real += int(lengths[idx].sum())
        computed += len(idx) * width
        count += 1
    return {"efficiency": round(real / computed, 4), "real_tokens": real,
            "computed_tokens": computed, "batches": count}


def wellfed_batches(lengths, world_size=1, pad_multiple=1):
    from wellfed.data.batching import BatchSpec, iterate_steps

    spec = BatchSpec(global_batch=BATCH, world_size=world_size, micro_rows=BATCH, micro_tokens=0,
                     pad_multiple=pad_multiple, seed=SEED, pool_batches=64)
    for rank in range(world_size):  # each rank pads its own micro-batches
        for step in iterate_steps(lengths, spec, rank):
            yield from step.micro


def chunks(order: np.ndarray):
    return [order[i:i + BATCH] for i in range(0, len(order), BATCH)]


def main() -> None:
    harness.require_sst2(NAME)
    clock = harness.Clock()
    from transformers import AutoTokenizer
    from wellfed.data.tokenization import SplitTokenizer

    texts, _ = harness.read_sst2("train")
    tokenizer = AutoTokenizer.from_pretrained(harness.model_path())
    _, lengths, _ = SplitTokenizer(tokenizer, MAX_LENGTH, 8192).encode(texts)
    print(f"[bench] padding: {len(lengths):,} rows, mean {lengths.mean():.1f} tokens")

    rng = np.random.default_rng(SEED)
    results = {"wellfed": efficiency(lengths, wellfed_batches(lengths)),
               "random_dynamic": efficiency(lengths, chunks(rng.permutation(len(lengths)))),
               "pad_to_max_length": {
                   "efficiency": round(float(lengths.sum()) / (len(lengths) * MAX_LENGTH), 4),
                   "real_tokens": int(lengths.sum()), "computed_tokens": len(lengths) * MAX_LENGTH,
                   "batches": -(-len(lengths) // BATCH)}}
    try:
        import torch
        from transformers.trainer_pt_utils import LengthGroupedSampler

        sampler = LengthGroupedSampler(BATCH, lengths=lengths.tolist(),
                                       generator=torch.Generator().manual_seed(SEED))
        results["length_grouped"] = efficiency(lengths, chunks(np.fromiter(iter(sampler), np.int64)))
    except ImportError as err:
        results["length_grouped"] = {"skipped": f"LengthGroupedSampler not importable: {err}"}
    extra = {"wellfed_2_ranks": efficiency(lengths, wellfed_batches(lengths, world_size=2)),
             "wellfed_pad_multiple_8": efficiency(lengths, wellfed_batches(lengths, pad_multiple=8),
                                                  pad_multiple=8)}
    for name, r in {**results, **extra}.items():
        print(f"[bench]   {name:24s} {r.get('efficiency', r.get('skipped'))}")

    eff = results["wellfed"]["efficiency"]
    ratios = {"wellfed_efficiency": harness.ratio(eff, TARGET, of="wellfed real/computed tokens",
                                                  over="1 (absolute efficiency)")}
    for name in ("random_dynamic", "pad_to_max_length", "length_grouped"):
        if "efficiency" in results[name]:
            ratios[f"wellfed_over_{name}"] = {
                "value": round(eff / results[name]["efficiency"], 3), "target": None, "met": None,
                "note": "informational: tokens computed per real token, contender / wellfed"}
    harness.write_result(NAME, {
        "what": "padding efficiency = real tokens / tokens computed, one epoch of SST-2 train, batch 32",
        "config": {"rows": int(len(lengths)), "batch": BATCH, "max_length": MAX_LENGTH, "seed": SEED,
                   "pool_batches": 64, "mean_length": round(float(lengths.mean()), 2),
                   "max_length_seen": int(lengths.max())},
        "contenders": results, "extra": extra, "ratios": ratios,
        "all_met": all(r["met"] for r in ratios.values() if r["met"] is not None),
        "machine": harness.machine(), **clock.summary()})


if __name__ == "__main__":
    main()
