"""Tokenize-stage throughput end to end (parquet in, token file on disk) and its peak memory.

(Not named tokenize.py: a script of that name shadows the standard library module.)

Throughput, SST-2 train (67,349 rows), the same fast tokenizer, truncation at max_length 128,
tokenizer loading outside the timing, rounds alternating the order:
  wellfed_parallel  SplitTokenizer(batch_rows 8192).batches(parquet) -> write_token_file with
                    TOKENIZERS_PARALLELISM=true, as stages/tokenize_text.py runs it: the Rust
                    tokenizer encodes each batch on every core, the next batch while this one is
                    flattened and written
  wellfed_today     the stage as it ran before: batches encoded one after another
                    (SplitTokenizer.encode per parquet batch) with TOKENIZERS_PARALLELISM=false
                    (the Makefile exported false for every stage)
  datasets_np2_ids  Dataset(pq.read_table(parquet)).map(tokenizer, batched=True, num_proc=2) ->
                    save_to_disk, input_ids only (the same content wellfed writes), each of the 2
                    processes encoding serially (TOKENIZERS_PARALLELISM=false: parallel encoders
                    in 2 processes would fight over 2 cores)
  datasets_np2_default  the same with the tokenizer's default outputs (input_ids,
                    token_type_ids, attention_mask): the usual recipe
Targets: wellfed_parallel >= 1.5x wellfed_today, and >= 1.2x datasets with num_proc=2 (both
variants). cpu_share per run = CPU seconds (threads and worker processes) / (wall x 2 cores):
~1 when a run had both cores, ~0.5 for a serial one; a parallel contender below 0.75 means other
work took the cores (`contended`).

Peak RSS of wellfed's path (parallel) on 250k and 1M synthetic rows (SST-2 sentences sampled
with replacement): each size runs in a fresh subprocess that loads the tokenizer as the stage
does and reads resource.getrusage(RUSAGE_SELF).ru_maxrss. Targets: < 1 GB at both sizes, and
not growing with rows, taken as: peak at 1M rows within 10% of the peak at 250k rows.

usage: python benchmarks/tokenize_stage.py
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import harness

NAME = "tokenize_stage"
MAX_LENGTH = 128
BATCH_ROWS = 8192  # params.yaml tokenize.batch_rows
ROUNDS = 5  # ~1.5 + 2 + 2 + 3 s a round
RSS_SIZES = (250_000, 1_000_000)
TARGET_PARALLEL = 1.5  # wellfed_parallel over wellfed_today
TARGET_DATASETS = 1.2  # wellfed_parallel over datasets.map(num_proc=2)
CONTENDED = 0.75  # cpu_share under which a parallel run did not have both cores
TARGET_RSS_MB = 1024
TARGET_RSS_GROWTH = 0.10


def run_wellfed(tokenizer, parquet: Path, out: Path) -> int:
    from wellfed.data.token_files import write_token_file
    from wellfed.data.tokenization import SplitTokenizer

    os.environ["TOKENIZERS_PARALLELISM"] = "true"  # the Rust tokenizer reads it at each call
    encoder = SplitTokenizer(tokenizer, MAX_LENGTH, BATCH_ROWS)
    return write_token_file(out, encoder.batches(str(parquet), "train"),
                            {"max_length": str(MAX_LENGTH)})


def run_today(tokenizer, parquet: Path, out: Path) -> int:
    """The stage before: one batch encoded after another, the tokenizer on one core."""
    import pyarrow.parquet as pq

    from wellfed.data.token_files import TokenBatch, write_token_file
    from wellfed.data.tokenization import SplitTokenizer

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    encoder = SplitTokenizer(tokenizer, MAX_LENGTH, BATCH_ROWS)

    def batches():
        for batch in pq.ParquetFile(parquet).iter_batches(BATCH_ROWS,
                                                          columns=["row_id", "text", "label"]):
            values, lengths, _ = encoder.encode(batch.column("text").to_pylist())
            yield TokenBatch(values, lengths, batch.column("label").to_numpy(),
                             batch.column("row_id").to_numpy())

    return write_token_file(out, batches(), {"max_length": str(MAX_LENGTH)})


def run_datasets(tokenizer, parquet: Path, out: Path, only_ids: bool) -> int:
    import datasets
    import pyarrow.parquet as pq

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # 2 processes, one core each
    extra = {"return_token_type_ids": False, "return_attention_mask": False} if only_ids else {}
    ds = datasets.Dataset(pq.read_table(parquet))
    ds = ds.map(lambda b: tokenizer(b["text"], truncation=True, max_length=MAX_LENGTH, **extra),
                batched=True, num_proc=2, remove_columns=["text"], load_from_cache_file=False)
    ds.save_to_disk(str(out))
    return len(ds)


def cpu_seconds() -> float:
    """This process's CPU time, every thread, plus that of its finished children."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def rss_child(parquet: str, out: str) -> None:
    """Runs in a fresh interpreter: the stage's tokenizer load, then one tokenize pass."""
    from wellfed.model import load_tokenizer

    tokenizer = load_tokenizer(harness.model_path())
    # ru_maxrss already holds the import-time high-water mark; VmRSS is what is resident now.
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    resident = next(int(line.split()[1]) / 1024 for line in open("/proc/self/status")
                    if line.startswith("VmRSS:"))
    t0 = time.perf_counter()
    rows = run_wellfed(tokenizer, Path(parquet), Path(out))
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rows": rows, "peak_rss_mb": round(peak, 1),
                      "peak_rss_before_pass_mb": round(before, 1),
                      "rss_before_pass_mb": round(resident, 1),
                      "pass_adds_mb": round(peak - resident, 1),
                      "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds)}))


def synthetic_parquet(path: Path, texts: list[str], rows: int, seed: int) -> Path:
    """`rows` SST-2 sentences sampled with replacement, written 100k rows at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    pool = np.asarray(texts, dtype=object)
    schema = pa.schema([("row_id", pa.int64()), ("text", pa.string()), ("label", pa.int64())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            writer.write_table(pa.table({
                "row_id": np.arange(start, start + n, dtype=np.int64),
                "text": pa.array(pool[rng.integers(0, len(pool), n)].tolist(), pa.string()),
                "label": rng.integers(0, 2, n)}, schema=schema))
    return path


def same_ids(token_file: Path, ds_dir: Path) -> bool:
    import datasets
    from wellfed.data.token_files import TokenFile

    data, ds = TokenFile(token_file), datasets.load_from_disk(str(ds_dir))
    theirs = ds.data.column("input_ids").combine_chunks()
    return (len(data) == len(ds) and np.array_equal(data.values, theirs.values.to_numpy())
            and np.array_equal(data.lengths, np.diff(theirs.offsets.to_numpy())))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--rss-child":
        rss_child(sys.argv[2], sys.argv[3])
        return
    harness.require_sst2(NAME)
    clock = harness.Clock()
    import datasets
    import torch
    from wellfed.model import load_tokenizer

    torch.set_num_threads(harness.THREADS)
    datasets.disable_progress_bars()
    texts, labels = harness.read_sst2("train")
    tokenizer = load_tokenizer(harness.model_path())

    contenders = {
        "wellfed_parallel": lambda out: run_wellfed(tokenizer, parquet, out),
        "wellfed_today": lambda out: run_today(tokenizer, parquet, out),
        "datasets_np2_ids": lambda out: run_datasets(tokenizer, parquet, out, only_ids=True),
        "datasets_np2_default": lambda out: run_datasets(tokenizer, parquet, out, only_ids=False)}
    times = {name: [] for name in contenders}
    shares = {name: [] for name in contenders}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        parquet = harness.write_parquet(tmp / "train.parquet", texts, labels)
        for r in range(ROUNDS):
            names = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
            for name in names:
                out = tmp / f"{name}.out"
                cpu0, t0 = cpu_seconds(), time.perf_counter()
                rows = contenders[name](out)
                seconds = time.perf_counter() - t0
                times[name].append(seconds)
                shares[name].append((cpu_seconds() - cpu0) / (seconds * harness.THREADS))
                if rows != len(texts):
                    raise RuntimeError(f"{name} wrote {rows} rows, expected {len(texts)}")
                if r < ROUNDS - 1:
                    shutil.rmtree(out) if out.is_dir() else out.unlink()
            print(f"[bench] tokenize: round {r + 1}/{ROUNDS}: "
                  + ", ".join(f"{n} {times[n][-1]:.2f}s (cpu {shares[n][-1]:.2f})"
                              for n in contenders), flush=True)
        identical = same_ids(tmp / "wellfed_parallel.out", tmp / "datasets_np2_ids.out")

        memory = {}
        for i, rows in enumerate(RSS_SIZES):
            source = synthetic_parquet(tmp / f"synthetic_{rows}.parquet", texts, rows, seed=i)
            proc = subprocess.run([sys.executable, __file__, "--rss-child", str(source),
                                   str(tmp / f"synthetic_{rows}.arrow")],
                                  capture_output=True, text=True, check=True)
            memory[str(rows)] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"[bench] tokenize: {rows:,} synthetic rows -> {memory[str(rows)]}")
            for leftover in (source, tmp / f"synthetic_{rows}.arrow"):
                leftover.unlink(missing_ok=True)

    stats = {name: {"seconds_median": round(statistics.median(t), 3),
                    "seconds_all": [round(x, 3) for x in t],
                    "rows_per_s": round(len(texts) / statistics.median(t)),
                    "cpu_share_median": round(statistics.median(shares[name]), 3),
                    "cpu_share_all": [round(x, 3) for x in shares[name]]}
             for name, t in times.items()}
    small, large = (memory[str(n)]["peak_rss_mb"] for n in RSS_SIZES)
    median = {name: stats[name]["seconds_median"] for name in stats}
    ratios = {
        "stage_now_vs_today": harness.ratio(
            median["wellfed_today"] / median["wellfed_parallel"], TARGET_PARALLEL,
            of="wellfed rows/s: every core, next batch encoded while one is written (now)",
            over="wellfed rows/s: TOKENIZERS_PARALLELISM=false, one batch after another (before)"),
        "wellfed_vs_datasets_map_np2_ids_only": harness.ratio(
            median["datasets_np2_ids"] / median["wellfed_parallel"], TARGET_DATASETS,
            of="wellfed rows/s (parallel)",
            over="datasets map(batched, num_proc=2)+save_to_disk rows/s, input_ids only"),
        "wellfed_vs_datasets_map_np2": harness.ratio(
            median["datasets_np2_default"] / median["wellfed_parallel"], TARGET_DATASETS,
            of="wellfed rows/s (parallel)",
            over="datasets map(batched, num_proc=2)+save_to_disk rows/s, default outputs"),
        **{f"peak_rss_mb_{rows:,}_rows".replace(",", "_"): harness.ratio(
            memory[str(rows)]["peak_rss_mb"], TARGET_RSS_MB, of=f"peak RSS MB at {rows:,} rows",
            over="1 (absolute MB)", higher_is_better=False) for rows in RSS_SIZES},
        "peak_rss_growth_250k_to_1M": harness.ratio(
            large / small - 1, TARGET_RSS_GROWTH, of=f"peak RSS at {RSS_SIZES[1]:,} rows",
            over=f"peak RSS at {RSS_SIZES[0]:,} rows, minus 1", higher_is_better=False),
    }
    per_row = (large - small) * 2**20 / (RSS_SIZES[1] - RSS_SIZES[0])
    harness.write_result(NAME, {
        "what": "tokenize stage end to end (parquet -> tokens on disk) rows/s; peak RSS vs row count",
        "config": {"rows": len(texts), "max_length": MAX_LENGTH, "batch_rows": BATCH_ROWS,
                   "rounds": ROUNDS, "tokenizer": type(tokenizer).__name__,
                   "identical_token_ids": bool(identical)},
        "contenders": stats,
        "memory": {**memory, "growth_mb": round(large - small, 1),
                   "growth_bytes_per_extra_row": round(per_row, 1),
                   "rows_at_1GB_if_linear": int(RSS_SIZES[1] + (TARGET_RSS_MB - large) * 2**20 / per_row)
                   if per_row > 0 else None},
        "ratios": ratios,
        "all_met": all(r["met"] for r in ratios.values()),
        "contended": min(stats[n]["cpu_share_median"] for n in
                         ("wellfed_parallel", "datasets_np2_ids", "datasets_np2_default"))
        < CONTENDED,
        "machine": harness.machine(), **clock.summary()})


if __name__ == "__main__":
    main()
