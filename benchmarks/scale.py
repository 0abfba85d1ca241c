"""Scale: prepare + tokenize on a synthetic ~10M-row, ~1 GB CSV, and a 3B-token token file.

(a) A synthetic CSV `text,label` goes through the real stages as a user runs them:
    stages/prepare.py, then stages/tokenize_text.py, each a subprocess in a temporary project
    (train file only, so prepare also carves a validation split). Rows: 3 to 28 words drawn from
    the model's own whole-word vocabulary (~95 bytes a row); 10% hold a comma and 1% a quote, so
    the csv writer quotes them; 2% repeat an earlier row (a tenth of those with another label);
    3 classes. Each stage's peak RSS is its own ru_maxrss (os.wait4 on that child), its rows/s
    its wall time over the rows it read. Target: peak RSS < 1.5 GB for each stage.
(b) A 3B-token file written with write_token_file from generated batches: 30M rows x 100 tokens
    of random ids, each 100k-row batch drawn from a generator seeded by its index, so any row can
    be drawn again to check it (in a subprocess: its peak RSS). Then TokenFile opens it: rows
    whose tokens start past 2^31 are gathered and compared with what was written, and random
    32-row gathers are timed. Gather speed against the format before 64-bit offsets: a 1M-row
    file of the same shape read with large_list offsets and with 32-bit list offsets (target:
    >= 0.9x); the 3B-token file's speed over the 1M-row one is reported for information (the
    same code, rows spread over 12 GB instead of 0.4 GB).

Everything lives in one temporary folder (~27 GB at the peak of (b): the token file and its
scratch copy), deleted at the end; free space is checked first and the sizes are cut to fit.
Not in run_all's list: on this 2-core machine it takes ~11 minutes.

usage: python benchmarks/scale.py [--rows N] [--tokens N]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import harness

NAME = "scale"
ROOT = Path(__file__).resolve().parents[1]
ROWS = 10_000_000
TOKENS = 3_000_000_000
TOKEN_WIDTH = 100  # tokens a row in (b): 30M rows for 3B tokens
TOKEN_BATCH = 100_000  # rows per generated batch in (b)
GATHERS = 2_000  # random 32-row batches timed per file
TARGET_RSS_MB = 1536
TARGET_GATHER = 0.9  # 64-bit offsets gather at >= 0.9x the speed of 32-bit ones
CSV_CHUNK = 200_000
PAST = 2**31  # rows whose tokens start past here are checked: where 32-bit offsets would end


def vocabulary() -> list[str]:
    """Whole words of the model's WordPiece vocabulary (one token each, mostly)."""
    words = (Path(harness.model_path()) / "vocab.txt").read_text(encoding="utf-8").split("\n")
    return [w for w in words if w.isalpha() and w.isascii() and len(w) > 1]


def write_csv(path: Path, rows: int, seed: int = 0) -> int:
    """The synthetic raw file (see the module docstring); returns its size in bytes."""
    rng = np.random.default_rng(seed)
    words = vocabulary()
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["text", "label"])
        for start in range(0, rows, CSV_CHUNK):
            n = min(CSV_CHUNK, rows - start)
            counts = rng.integers(3, 29, n)
            picks = rng.integers(0, len(words), int(counts.sum())).tolist()
            ends = np.cumsum(counts).tolist()
            texts = [" ".join(words[i] for i in picks[a:b]) for a, b in zip([0] + ends[:-1], ends)]
            labels = rng.integers(0, 3, n).astype(str).tolist()
            for i in np.flatnonzero(rng.random(n) < 0.10).tolist():
                texts[i] = texts[i].replace(" ", ", ", 1)
            for i in np.flatnonzero(rng.random(n) < 0.01).tolist():
                texts[i] = f'"{texts[i]}" he said'
            for i in np.flatnonzero(rng.random(n) < 0.02).tolist():
                j = int(rng.integers(0, n))
                texts[i] = texts[j]
                labels[i] = labels[j] if rng.random() < 0.9 else str((int(labels[j]) + 1) % 3)
            writer.writerows(zip(texts, labels))
    return path.stat().st_size


def run_stage(project: Path, script: str, *args: str) -> dict:
    """One stage as a subprocess: its wall time, its own peak RSS, and its output lines."""
    log = project / f"{script}.log"
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "stages" / script), *args], cwd=project,
                                stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{script} failed ({proc.returncode}): {log.read_text()[-2000:]}")
    return {"seconds": round(seconds, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "lines": [line for line in log.read_text().splitlines() if "[wellfed]" in line]}


def pipeline(tmp: Path, rows: int) -> dict:
    project = tmp / "project"
    (project / "raw").mkdir(parents=True)
    t0 = time.perf_counter()
    size = write_csv(project / "raw" / "train.csv", rows)
    made = time.perf_counter() - t0
    print(f"[bench] scale: wrote {rows:,} rows, {size / 1e9:.2f} GB in {made:.0f}s", flush=True)
    (project / "params.yaml").write_text(json.dumps({
        "prepare": {"train": "train.csv", "validation": "", "test": "", "text_column": "text",
                    "label_column": "label"},
        "tokenize": {"max_length": 128, "batch_rows": 8192}, "model": {"name": "default"}}))
    prepare = run_stage(project, "prepare.py", "raw", "prepared", "reports/prepare.json")
    report = json.loads((project / "reports" / "prepare.json").read_text())
    prepare["rows_read"] = report["splits"]["train"]["rows_read"]
    prepare["rows_per_s"] = round(prepare["rows_read"] / prepare["seconds"])
    prepare["report"] = {split: {k: r[k] for k in ("rows_read", "kept", "dropped",
                                                   "duplicates_found", "conflicts")}
                         for split, r in report["splits"].items()}
    print(f"[bench] scale: prepare {prepare['seconds']}s, peak {prepare['peak_rss_mb']} MB",
          flush=True)
    shutil.rmtree(project / "raw")
    tokenize = run_stage(project, "tokenize_text.py", "prepared", "tokens", "reports/tokens.json")
    stats = json.loads((project / "reports" / "tokens.json").read_text())
    tokenize["rows"] = sum(s["rows"] for s in stats.values())
    tokenize["tokens"] = sum(s["tokens"] for s in stats.values())
    tokenize["rows_per_s"] = round(tokenize["rows"] / tokenize["seconds"])
    tokenize["cpu_share"] = round(tokenize["cpu_s"] / tokenize["seconds"] / (os.cpu_count() or 1), 3)
    print(f"[bench] scale: tokenize {tokenize['seconds']}s, peak {tokenize['peak_rss_mb']} MB",
          flush=True)
    return {"csv_rows": rows, "csv_bytes": size, "csv_seconds": round(made, 1),
            "prepare": prepare, "tokenize": tokenize}


def token_batch(index: int, rows: int):
    """Batch `index` of (b): always the same ids for the same index."""
    from wellfed.data.token_files import TokenBatch

    rng = np.random.default_rng(index)
    start = index * TOKEN_BATCH
    return TokenBatch(rng.integers(1, 30_000, rows * TOKEN_WIDTH, dtype=np.int32),
                      np.full(rows, TOKEN_WIDTH, np.int32), np.arange(start, start + rows) % 2,
                      np.arange(start, start + rows, dtype=np.int64))


def write_tokens_child(path: str, rows: int) -> None:
    """Runs in a fresh interpreter: writes the token file of (b), prints its figures."""
    import resource

    from wellfed.data.token_files import write_token_file

    batches = (token_batch(i, min(TOKEN_BATCH, rows - i * TOKEN_BATCH))
               for i in range(-(-rows // TOKEN_BATCH)))
    t0 = time.perf_counter()
    written = write_token_file(path, batches)
    seconds = time.perf_counter() - t0
    print(json.dumps({"rows": written, "seconds": round(seconds, 1),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                           / 1024, 1)}))


def gathers_per_s(data, seed: int) -> float:
    rng = np.random.default_rng(seed)
    batches = [rng.integers(0, len(data), 32) for _ in range(GATHERS)]
    for idx in batches[:GATHERS // 10]:  # warm-up
        data.gather(idx, pad_id=0)
    t0 = time.perf_counter()
    for idx in batches:
        data.gather(idx, pad_id=0)
    return GATHERS / (time.perf_counter() - t0)


def token_file(tmp: Path, rows: int) -> dict:
    from wellfed.data.token_files import TokenFile

    path = tmp / "big.arrow"
    proc = subprocess.run([sys.executable, __file__, "--write-tokens", str(path), str(rows)],
                          capture_output=True, text=True, check=True)
    written = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"[bench] scale: token file {written}", flush=True)
    data = TokenFile(path)
    past = int(np.searchsorted(data.offsets, PAST, side="right"))  # first row past 2^31 tokens
    checked = 0
    if past < len(data):
        rng = np.random.default_rng(1)
        spots = sorted({past, len(data) - 1, *rng.integers(past, len(data), 6).tolist()})
        got = data.gather(np.array(spots), pad_id=0)["input_ids"]
        for k, i in enumerate(spots):
            b = i // TOKEN_BATCH
            batch = token_batch(b, min(TOKEN_BATCH, rows - b * TOKEN_BATCH))
            at = (i - b * TOKEN_BATCH) * TOKEN_WIDTH
            expected = batch.values[at:at + TOKEN_WIDTH]
            if not (np.array_equal(data.row(i), expected) and np.array_equal(got[k], expected)):
                raise RuntimeError(f"row {i} of the token file differs from what was written")
            checked += 1
    big, tokens = gathers_per_s(data, seed=2), int(data.offsets[-1])
    del data
    small = tmp / "small.arrow"  # 1M rows of the same shape, 64-bit offsets as written today
    subprocess.run([sys.executable, __file__, "--write-tokens", str(small), "1000000"],
                   capture_output=True, text=True, check=True)
    wide = TokenFile(small)
    narrow = list_32_bit_copy(wide, tmp / "small32.arrow")
    speeds = {"64": [], "32": []}
    for r in range(3):  # alternate: the two files see the same machine
        for name, file in (("64", wide), ("32", narrow))[::1 if r % 2 == 0 else -1]:
            speeds[name].append(gathers_per_s(file, seed=3 + r))
    return {"rows": written["rows"], "tokens": tokens,
            "file_bytes": path.stat().st_size, "write_seconds": written["seconds"],
            "write_peak_rss_mb": written["peak_rss_mb"],
            "first_row_past_2_31_tokens": past, "rows_checked_past_2_31": checked,
            "gather_32_batches_per_s": round(big, 1),
            "gather_32_batches_per_s_1M_rows_64_bit": round(float(np.median(speeds["64"])), 1),
            "gather_32_batches_per_s_1M_rows_32_bit": round(float(np.median(speeds["32"])), 1)}


def list_32_bit_copy(data, path: Path):
    """The same rows with 32-bit list offsets (the format before large_list), as TokenFile."""
    import pyarrow as pa

    from wellfed.data.token_files import TokenFile

    ids = pa.ListArray.from_arrays(pa.array(data.offsets.astype(np.int32)), pa.array(data.values))
    batch = pa.record_batch([ids, pa.array(data.labels), pa.array(data.lengths),
                             pa.array(data.row_ids)], names=["input_ids", "label", "length",
                                                             "row_id"])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return TokenFile(path)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--write-tokens":
        write_tokens_child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=ROWS, help="rows of the synthetic CSV")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="tokens of the token file")
    args = parser.parse_args()
    clock = harness.Clock()
    with tempfile.TemporaryDirectory(prefix="wellfed-scale-") as tmp:
        tmp = Path(tmp)
        free = shutil.disk_usage(tmp).free
        # (b) needs the file and its scratch copy at once: 2 x 4 bytes a token, plus 10%.
        tokens = min(args.tokens, int(free * 0.8 / 8.8) // TOKEN_WIDTH * TOKEN_WIDTH)
        notes = [] if tokens == args.tokens else [
            f"{args.tokens:,} tokens asked; {tokens:,} fit the {free / 1e9:.0f} GB free"]
        scale = pipeline(tmp, args.rows)
        shutil.rmtree(tmp / "project")
        scale["token_file"] = token_file(tmp, tokens // TOKEN_WIDTH)
    a, b = scale, scale["token_file"]
    ratios = {
        "prepare_peak_rss_mb": harness.ratio(
            a["prepare"]["peak_rss_mb"], TARGET_RSS_MB, of=f"prepare stage peak RSS MB, "
            f"{args.rows:,} rows", over="1 (absolute MB)", higher_is_better=False),
        "tokenize_peak_rss_mb": harness.ratio(
            a["tokenize"]["peak_rss_mb"], TARGET_RSS_MB, of=f"tokenize stage peak RSS MB, "
            f"{a['tokenize']['rows']:,} rows", over="1 (absolute MB)", higher_is_better=False),
        "gather_64_vs_32_bit_offsets": harness.ratio(
            b["gather_32_batches_per_s_1M_rows_64_bit"]
            / b["gather_32_batches_per_s_1M_rows_32_bit"], TARGET_GATHER,
            of="32-row gathers/s, 1M rows x 100 tokens, 64-bit offsets (large_list)",
            over="the same rows with 32-bit offsets (list)"),
        "gather_3B_token_file_vs_1M_rows": {  # info: the same code over 12 GB instead of 0.4
            "value": round(b["gather_32_batches_per_s"]
                           / b["gather_32_batches_per_s_1M_rows_64_bit"], 3),
            "target": None, "comparison": None, "met": None,
            "numerator": f"32-row gathers/s on the {b['tokens']:,}-token file",
            "denominator": "the same on the 1M-row file (64-bit offsets)"},
    }
    harness.write_result(NAME, {
        "what": "prepare + tokenize stages on a synthetic CSV (peak RSS, rows/s); a 3B-token "
                "token file written, checked past 2^31 tokens and gathered",
        "config": {"rows": args.rows, "tokens_asked": args.tokens, "token_width": TOKEN_WIDTH,
                   "gathers": GATHERS, "notes": notes},
        "results": scale, "ratios": ratios,
        "all_met": all(r["met"] for r in ratios.values() if r["target"] is not None),
        "machine": harness.machine(), **clock.summary()})


if __name__ == "__main__":
    main()
