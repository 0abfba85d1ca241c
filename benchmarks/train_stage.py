"""End to end, as a user waits for it: wellfed's train stage vs an HF Trainer script, model load
to saved model, on 2,048 and 20,000 SST-2 train rows. (The whole pipeline and the lr iteration:
benchmarks/pipeline.py.)

  wellfed  `python stages/train.py` in a scratch copy of the project (params.yaml defaults but
           1 epoch, validation = SST-2 dev at the end only): the in-process worker (model load,
           steps, validation, checkpoints), export to data/model with calibration, history,
           plots, diagnosis, the MLflow run, model and registry version. The prepare and
           tokenize stages run before, untimed in the ratio (their times are in the JSON).
  trainer  benchmarks/hf_trainer_script.py: pandas + Dataset.map tokenization, Trainer with
           length grouping, the same recipe, one validation at the end, then save_model.
Each side is timed as a fresh subprocess, wall clock from start to exit (imports included, no
untimed warm-up). Rows are the first N of SST-2 train (as the CI-sized e2e test). 2,048 rows
run A B B A, 20,000 rows A B (each side ~4 min here). The train stage's time budget (from
process start, telemetry/budget.py) is kept per run, with the fixed cost (everything but
steps). Targets: the train stage >= 1.0x the Trainer script at 2,048 rows (trainer seconds /
wellfed seconds) and at 20,000 rows.

Running some sizes keeps the other sizes' cases from the last result file; every case records
when and at which commit it was measured.

usage: python benchmarks/train_stage.py [ROWS ...]      (default: 2048 20000)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import harness

NAME = "train_stage"
PROJECT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
ORDERS = {2048: ("wellfed", "trainer", "trainer", "wellfed")}
DEFAULT_ORDER = ("wellfed", "trainer")
SPEED_TARGET = 1.0


def env() -> dict:
    out = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "DVC_EXP_NAME", "DVC_ROOT")}
    out.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(HERE)})
    out["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{out['PATH']}"
    return out


def make_project(root: Path, rows: int) -> Path:
    """A scratch copy of the pipeline with the first `rows` SST-2 train rows and SST-2 dev."""
    root.mkdir(parents=True)
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(PROJECT / name, root / name)
    shutil.copytree(PROJECT / "stages", root / "stages",
                    ignore=shutil.ignore_patterns("__pycache__"))
    raw = root / "data" / "raw"
    raw.mkdir(parents=True)
    lines = (harness.SST2 / "train.tsv").read_text(encoding="utf-8").splitlines(True)
    (raw / "train.tsv").write_text("".join(lines[:rows + 1]), encoding="utf-8")
    shutil.copy(harness.SST2 / "dev.tsv", raw / "dev.tsv")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["prepare"]["test"] = ""
    params["train"].update(epochs=1, eval_every=0)  # validation at the end, as the Trainer's
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return seconds, proc.stdout + proc.stderr


def run_wellfed(project: Path) -> dict:
    for name in ("data/model", "data/train", "data/checkpoints"):
        shutil.rmtree(project / name, ignore_errors=True)
    seconds, _ = timed([sys.executable, "stages/train.py", "data/tokens", "data/model",
                        "data/train", "data/checkpoints", "--time", "data/reports/time/train.json"],
                       project)
    budget = json.loads((project / "data" / "reports" / "time" / "train.json").read_text())
    metrics = json.loads((project / "data" / "train" / "metrics.json").read_text())
    return {"wall_s": round(seconds, 1), "stage_reported_s": round(budget["total_s"], 1),
            "fixed_s": round(budget["fixed_s"], 1),
            "parts_s": {k: round(v, 2) for k, v in budget["parts_s"].items()},
            "val_accuracy": metrics.get("val/accuracy")}


def run_trainer(project: Path) -> dict:
    out_dir = project / "hf_out"
    shutil.rmtree(out_dir, ignore_errors=True)
    seconds, out = timed([sys.executable, str(HERE / "hf_trainer_script.py"),
                          "data/raw/train.tsv", "data/raw/dev.tsv", str(out_dir), "0"], project)
    result = json.loads([line for line in out.splitlines() if line.startswith('{"phases"')][-1])
    steps = result["phases"]["train (with evals)"]
    return {"wall_s": round(seconds, 1), "parts_s": {k: round(v, 1) for k, v in
                                                     result["phases"].items()},
            "fixed_s": round(seconds - steps, 1), "val_accuracy": result["val_accuracy"]}


def case(rows: int, scratch: Path) -> dict:
    project = make_project(scratch / f"rows_{rows}", rows)
    prep_s, _ = timed([sys.executable, "stages/prepare.py", "data/raw", "data/prepared",
                       "data/reports/prepare.json"], project)
    tok_s, _ = timed([sys.executable, "stages/tokenize_text.py", "data/prepared", "data/tokens",
                      "data/reports/tokens.json"], project)
    runs = {"wellfed": [], "trainer": []}
    measured = {"measured_at": time.strftime("%Y-%m-%d %H:%M"), "commit": commit()}
    for n, name in enumerate(ORDERS.get(rows, DEFAULT_ORDER), 1):
        record = (run_wellfed if name == "wellfed" else run_trainer)(project)
        record["order"] = n
        runs[name].append(record)
        print(f"[bench] train_stage {rows} rows: run {n} {name}: {record['wall_s']} s "
              f"(fixed {record['fixed_s']} s), val accuracy {record['val_accuracy']:.4f}",
              flush=True)
    mean = {name: sum(r["wall_s"] for r in rs) / len(rs) for name, rs in runs.items()}
    fixed = sum(r["fixed_s"] for r in runs["wellfed"]) / len(runs["wellfed"])
    return {"rows": rows, **measured, "prepare_s": round(prep_s, 1), "tokenize_s": round(tok_s, 1),
            "runs": runs, "mean_wall_s": {k: round(v, 1) for k, v in mean.items()},
            "wellfed_fixed_s": round(fixed, 1),
            "ratios": {f"speed_{rows}_rows": harness.ratio(
                mean["trainer"] / mean["wellfed"], SPEED_TARGET,
                of="trainer script seconds", over="wellfed train stage seconds")}}


def commit() -> str:
    """The project's git HEAD, with '+changes' when the code it runs (src/, stages/, params,
    dvc.yaml) differs from it; '' without git."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=PROJECT, capture_output=True,
                                  text=True).stdout.strip()
        except OSError:
            return ""

    head = git("rev-parse", "--short", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "src", "stages",
                  "params.yaml", "dvc.yaml")
    return head + ("+changes" if head and changed else "")


def kept_cases(sizes: list[int], name: str = NAME) -> list[dict]:
    """Cases of other row counts from the last result file: running one size keeps the rest
    (each case says when and at which commit it was measured)."""
    try:
        old = json.loads((harness.RESULTS / f"{name}.json").read_text())
    except (OSError, ValueError):
        return []
    return [c for c in old.get("cases", []) if c.get("rows") not in sizes]


def main() -> None:
    harness.require_sst2(NAME)
    clock = harness.Clock()
    sizes = [int(a) for a in sys.argv[1:]] or [2048, 20_000]
    with tempfile.TemporaryDirectory(prefix="wellfed-train-stage-") as tmp:
        cases = [case(rows, Path(tmp)) for rows in sizes]
    cases = sorted(kept_cases(sizes) + cases, key=lambda c: c["rows"])
    ratios = {k: v for c in cases for k, v in c["ratios"].items()}
    harness.write_result(NAME, {
        "what": ("train stage end to end (subprocess wall time, imports to saved model) vs an "
                 "HF Trainer script doing the same recipe; ratio = trainer s / wellfed s"),
        "cases": cases, "ratios": ratios,
        "all_met": all(r["met"] for r in ratios.values() if r["target"] is not None),
        "machine": harness.machine(), **clock.summary()})


if __name__ == "__main__":
    main()
