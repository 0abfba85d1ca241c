"""The one tokenizer pass: prepared texts -> unpadded token ids, batch by batch.

It calls the Rust tokenizer directly (`encode_batch_fast`: no offsets, no padding) and flattens
its id lists with `itertools.chain` into numpy: the encode step alone ran at ~55,000 SST-2 rows/s
here versus ~20,000 for `tokenizer(texts)` through transformers. End to end with the Arrow write,
on every core with the next batch encoding while one is written, the stage did ~41,000 SST-2
rows/s on 2 cores: 1.5x the stage before (one core, one batch after another) and 1.8x
`datasets.map(num_proc=2)` + `save_to_disk` (benchmarks/tokenize_stage.py). Memory stays that
of a batch or two: peak RSS 538 MB at 250k rows, 561 MB at 1M.
"""

from __future__ import annotations

import copy
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from wellfed.data.token_files import TokenBatch


def token_stats(rows_per_length: np.ndarray, truncated: int) -> dict:
    """Rows, tokens and the length distribution from `rows_per_length[n]` (rows of n tokens):
    a histogram as long as max_length instead of one number per row, so memory does not grow
    with rows. Percentiles interpolate as np.percentile does on the lengths themselves."""
    counts = np.asarray(rows_per_length, np.int64)
    rows = int(counts.sum())
    if rows == 0:
        return {"rows": 0, "tokens": 0, "truncated_rows": truncated}
    tokens = int(counts @ np.arange(len(counts), dtype=np.int64))
    p50, p90, p99 = (_percentile(counts, rows, q) for q in (50, 90, 99))
    return {"rows": rows, "tokens": tokens,
            "length_mean": round(tokens / rows, 2), "length_p50": round(p50, 2),
            "length_p90": round(p90, 2), "length_p99": round(p99, 2),
            "length_max": int(np.flatnonzero(counts)[-1]), "truncated_rows": int(truncated)}


def stats_line(split: str, stats: dict, max_length: int, seconds: float) -> str:
    """The console's sentence for one split's `token_stats`, e.g. `tokenize train: 3,000 rows,
    36,435 tokens (a row: mean 12.1, p50 12, p90 16, p99 19, max 20); none cut at max_length
    128; 0.2 s, 15,000 rows/s`."""
    rows = stats["rows"]
    if not rows:
        return f"tokenize {split}: no rows"
    lengths = ", ".join(f"{name} {stats[f'length_{name}']:g}"
                        for name in ("mean", "p50", "p90", "p99", "max"))
    cut = stats["truncated_rows"]
    cut = (f"none cut at max_length {max_length}" if not cut else
           f"{cut:,} rows ({cut / rows:.1%}) cut at max_length {max_length}: raise "
           "tokenize.max_length to keep their ends")
    return (f"tokenize {split}: {rows:,} rows, {stats['tokens']:,} tokens (a row: {lengths}); "
            f"{cut}; {seconds:.1f} s, {rows / max(seconds, 1e-9):,.0f} rows/s")


def _percentile(counts: np.ndarray, rows: int, q: float) -> float:
    """np.percentile's default ("linear") on the sorted lengths the histogram stands for."""
    ends = np.cumsum(counts)
    fraction = q / 100
    index = rows * fraction + (1 + fraction * -1) - 1  # numpy's virtual index, alpha = beta = 1
    below = min(max(int(np.floor(index)), 0), rows - 1)
    t = index - np.floor(index)
    a, b = (float(np.searchsorted(ends, i, side="right")) for i in (below, min(below + 1, rows - 1)))
    return float(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)  # numpy's _lerp


def label_array(column) -> np.ndarray:
    """Class ids as int64, or one float32 row per example (multi-hot labels, regression targets)."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return column.flatten().to_numpy().astype(np.float32).reshape(len(column), -1)
    return column.to_numpy()


class SplitTokenizer:
    """Tokenizes a prepared parquet split in bounded-memory batches and keeps running stats."""

    def __init__(self, tokenizer, max_length: int, batch_rows: int):
        self.backend = copy.deepcopy(tokenizer.backend_tokenizer)
        self.backend.no_padding()
        self.backend.enable_truncation(max_length)
        self.max_length = max_length
        self.batch_rows = batch_rows
        self.truncated = 0
        self.seconds = 0.0  # batches()' wall time, for the console line; not in stats()
        self.rows_per_length = np.zeros(max_length + 1, np.int64)  # for stats(); bounded

    def encode(self, texts: list[str], pairs: list[str] | None = None,
               segments: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Token ids back to back, tokens per row, and (with `segments`) where each row's
        second segment starts: `token_type_ids` are rebuilt from it at gather, 4 bytes a row
        instead of 4 a token. A pair is cut longest side first (the tokenizer's default)."""
        return self._flat(self._encodings(texts, pairs), segments)

    def _encodings(self, texts: list[str], pairs: list[str] | None) -> list:
        return self.backend.encode_batch_fast(list(zip(texts, pairs)) if pairs else texts)

    def _flat(self, encodings: list, segments: bool):
        ids = [e.ids for e in encodings]
        lengths = np.fromiter(map(len, ids), np.int32, len(ids))
        values = np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum()))
        # Only rows that hit max_length can have been cut; look at just those encodings.
        at_limit = np.flatnonzero(lengths == self.max_length)
        self.truncated += sum(1 for i in at_limit if encodings[i].overflowing)
        starts = None
        if segments:  # type ids are 0...0 1...1: the second segment starts after the zeros
            second = np.fromiter(map(sum, (e.type_ids for e in encodings)), np.int32, len(ids))
            starts = lengths - second
        seen = np.bincount(lengths)
        if len(seen) > len(self.rows_per_length):
            self.rows_per_length = np.pad(self.rows_per_length,
                                          (0, len(seen) - len(self.rows_per_length)))
        self.rows_per_length[:len(seen)] += seen
        return values, lengths, starts

    def batches(self, parquet_path: str, desc: str, segments: bool = False) -> Iterator[TokenBatch]:
        """The split's token batches. While one batch is flattened here and written by the
        caller, the next is encoded in a worker thread: the Rust tokenizer lets go of the GIL,
        so its cores do not wait on this Python work. Two batches in flight at most."""
        # pre_buffer=False: pre-buffered reads stay cached for the reader's life, so memory
        # grew with the split (+310 MB over 3M rows of ~100 characters; flat without).
        source = pq.ParquetFile(parquet_path, pre_buffer=False)
        pair = "text_pair" in source.schema_arrow.names
        columns = ["row_id", "text"] + (["text_pair"] if pair else []) + ["label"]
        # A bar while it runs on a terminal, gone when done (the stage prints the split's
        # line); none in a log or a queued experiment, where it would stay at 0%.
        bar = tqdm(total=source.metadata.num_rows, desc=f"tokenize {desc}", unit="rows",
                   mininterval=1.0, leave=False, disable=None)
        started = time.perf_counter()

        def done(job, batch) -> TokenBatch:
            values, lengths, starts = self._flat(job.result(), segments and pair)
            bar.update(len(lengths))
            return TokenBatch(values, lengths, label_array(batch.column("label")),
                              batch.column("row_id").to_numpy(), starts)

        with ThreadPoolExecutor(max_workers=1) as worker:
            pending = None
            for batch in source.iter_batches(batch_size=self.batch_rows, columns=columns):
                job = worker.submit(self._encodings, batch.column("text").to_pylist(),
                                    batch.column("text_pair").to_pylist() if pair else None)
                if pending is not None:
                    yield done(*pending)
                pending = job, batch
            if pending is not None:
                yield done(*pending)
        bar.close()
        self.seconds += time.perf_counter() - started

    def stats(self) -> dict:
        return token_stats(self.rows_per_length, self.truncated)
