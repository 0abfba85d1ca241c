"""Run every side-by-side benchmark (`make bench`), one fresh interpreter each, then print a table.

Each benchmark writes benchmarks/results/<name>.json. A missed target is a result, not a
failure: this exits non-zero only when a benchmark crashes (or a name is unknown).
On this 2-core CPU box they take ~12 minutes together, train_throughput the longest.

usage: python benchmarks/run_all.py [NAME ...]     e.g. python benchmarks/run_all.py padding loader
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ("padding", "loader", "tokenize_stage", "telemetry_overhead",
              "train_throughput")  # quickest first


def summary_lines(name: str) -> list[str]:
    path = HERE / "results" / f"{name}.json"
    if not path.is_file():
        return [f"{name:18s} no result file"]
    result = json.loads(path.read_text())
    if "skipped" in result:
        return [f"{name:18s} skipped: {result['skipped']}"]
    lines = []
    if result.get("contended"):
        lines.append(f"{name:18s} WARNING: other processes took CPU from some runs (see cpu_share)")
    for key, r in result.get("ratios", {}).items():
        if r.get("target") is None:
            verdict = "info"
        else:
            verdict = f"{r['comparison']} {r['target']:<6} {'met' if r['met'] else 'MISSED'}"
        lines.append(f"{name:18s} {key:42s} {r['value']:>9} {verdict}")
    return lines


def main() -> None:
    names = sys.argv[1:] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        sys.exit(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")  # the model is packaged; never reach for the Hub
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    failed = []
    for i, name in enumerate(names, 1):
        print(f"[bench] ({i}/{len(names)}) {name} ...", flush=True)
        start = time.perf_counter()
        code = subprocess.run([sys.executable, str(HERE / f"{name}.py")], env=env).returncode
        print(f"[bench] ({i}/{len(names)}) {name}: exit {code} in {time.perf_counter() - start:.0f}s",
              flush=True)
        if code:
            failed.append(name)
    print("\n" + "\n".join(line for n in names for line in summary_lines(n)))
    if failed:
        sys.exit(f"benchmark(s) crashed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
