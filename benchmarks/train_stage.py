"""End to end, as a user waits for it: wellfed's train stage vs an HF Trainer script, model load
to saved model, on 2,048 and 20,000 SST-2 train rows.

  wellfed  `python stages/train.py` in a scratch copy of the project (params.yaml defaults but
           1 epoch, validation = SST-2 dev): Ray start, the worker (model load, steps,
           validation every 50 steps, checkpoints), Ray stop, export to data/model, history,
           plots, diagnosis, the MLflow model and its registry version. The prepare and
           tokenize stages run before, untimed in the ratio (their times are in the JSON).
  trainer  benchmarks/hf_trainer_script.py: pandas + Dataset.map tokenization, Trainer with
           length grouping, the same recipe, validation every 50 steps and at the end, then
           save_model.
Each side is timed as a subprocess, wall clock from start to exit (imports included). Rows are
the first N of SST-2 train (as the CI-sized e2e test). 2,048 rows run A B B A, 20,000 rows A B
(each side ~4 min here). The train stage prints its own time breakdown (telemetry/phases.py):
it is kept per run, with the fixed cost (everything but steps). Targets: fixed cost <= 15 s at
2,048 rows; wellfed/trainer speed (trainer seconds / wellfed seconds) >= 1.0 at 20,000 rows.

Running some sizes keeps the other sizes' cases from the last result file; every case records
when and at which commit it was measured.

usage: python benchmarks/train_stage.py [ROWS ...]      (default: 2048 20000)
"""

from __future__ import annotations

import json
import os
import re
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
FIXED_TARGET_S = 15.0
SPEED_TARGET = 1.0
BREAKDOWN = re.compile(r"\[wellfed\] train stage ([\d.]+) s: (.*); fixed cost \(all but steps\) "
                       r"([\d.]+) s")


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
    params["train"]["epochs"] = 1
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
    seconds, out = timed([sys.executable, "stages/train.py", "data/tokens", "data/model",
                          "data/train", "data/checkpoints"], project)
    found = BREAKDOWN.search(out)
    if not found:
        raise RuntimeError(f"the train stage printed no time breakdown:\n{out[-3000:]}")
    parts = dict((name, float(secs)) for name, secs in
                 re.findall(r"([a-z][a-z +/]*?) ([\d.]+)(?:,|$)", found.group(2)))
    metrics = json.loads((project / "data" / "train" / "metrics.json").read_text())
    return {"wall_s": round(seconds, 1), "stage_reported_s": float(found.group(1)),
            "fixed_s": float(found.group(3)), "parts_s": parts,
            "val_accuracy": metrics.get("val/accuracy")}


def run_trainer(project: Path) -> dict:
    out_dir = project / "hf_out"
    shutil.rmtree(out_dir, ignore_errors=True)
    seconds, out = timed([sys.executable, str(HERE / "hf_trainer_script.py"),
                          "data/raw/train.tsv", "data/raw/dev.tsv", str(out_dir)], project)
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
    out = {"rows": rows, **measured, "prepare_s": round(prep_s, 1), "tokenize_s": round(tok_s, 1),
           "runs": runs, "mean_wall_s": {k: round(v, 1) for k, v in mean.items()},
           "ratios": {f"speed_{rows}_rows": harness.ratio(
               mean["trainer"] / mean["wellfed"], SPEED_TARGET if rows >= 20_000 else None,
               of="trainer script seconds", over="wellfed train stage seconds")}}
    if rows <= 2048:
        out["ratios"][f"fixed_cost_s_{rows}_rows"] = harness.ratio(
            fixed, FIXED_TARGET_S, of="wellfed fixed seconds (stage minus steps)", over="1 s",
            higher_is_better=False)
        out.update(without_evaluation(runs))
        out["ratios"][f"fixed_cost_without_evaluation_s_{rows}_rows"] = harness.ratio(
            out["fixed_without_evaluation_s"]["wellfed"], None,
            of="wellfed fixed seconds without its validations (Trainer's: "
               f"{out['fixed_without_evaluation_s']['trainer']} s)", over="1 s",
            higher_is_better=False)
    return out


def without_evaluation(runs: dict) -> dict:
    """Both sides' fixed seconds with every evaluation taken out, like for like: wellfed's
    validations (during training and at the end) and the Trainer's final `evaluate()` (its
    evaluations during training are inside its train phase already). Not a target."""
    def mean(values: list[float]) -> float:
        return round(sum(values) / len(values), 1)

    return {"fixed_without_evaluation_s": {
        "wellfed": mean([r["fixed_s"] - r["parts_s"].get("validation", 0.0)
                         for r in runs["wellfed"]]),
        "trainer": mean([r["fixed_s"] - r["parts_s"].get("final eval", 0.0)
                         for r in runs["trainer"]])}}


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


def kept_cases(sizes: list[int]) -> list[dict]:
    """Cases of other row counts from the last result file: running one size keeps the rest
    (each case says when and at which commit it was measured)."""
    try:
        old = json.loads((harness.RESULTS / f"{NAME}.json").read_text())
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
