"""The run as a user waits for it: the whole `dvc repro`, and the `dvc exp run -S train.lr=...`
iteration after it, against the HF Trainer script a user would write, as fresh processes,
interleaved, on the first N SST-2 train rows with SST-2 dev as validation.

  pipeline   wellfed: `dvc repro --force` in a scratch project (git + DVC): prepare, tokenize,
             train (export, calibration, MLflow run and model, registry), evaluate (champion),
             every process from its start. trainer: benchmarks/hf_trainer_script.py (pandas +
             Dataset.map tokenization, Trainer with length grouping, one validation, save).
  iteration  after one untimed full run, `dvc exp run -S train.lr=<new>` (prepare and tokenize
             cached, so train, evaluate and DVC are timed) against the Trainer script at that lr
             (which tokenizes again: a script has nothing cached).

Both sides: MiniLM, 1 epoch, batch 32, 2 threads, validation at the end only (wellfed
train.eval_every 0; the Trainer's eval_strategy "no" and one evaluate()). The ratio is trainer
seconds / wellfed seconds (>= 1: wellfed is faster). Every wellfed run keeps its stages' time
budgets (data/reports/time/, the pipeline's parts and DVC's own seconds) and both sides'
validation accuracy (equal learning). 2,048 rows run A B B A; 20,000 rows A B.

Targets (issue: a run as fast as its steps): pipeline >= 0.75x at 2,048 rows and >= 1.05x at
20,000; iteration >= 0.9x at 2,048.

On a lent GPU (dvc and mlflow installed there) both sides run on it, bf16; WELLFED_BENCH_MODEL=
bert_base trains a BERT-base-sized random-init model on both sides instead of MiniLM, and the
result file is then benchmarks/results/gpu/pipeline_<model>.json.

usage: python benchmarks/pipeline.py [ROWS ...]      (default: 2048 20000)
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
import train_stage
from train_stage import HERE, PROJECT, commit, env, kept_cases, timed
from wellfed.telemetry.budget import same_process

MODEL = os.environ.get("WELLFED_BENCH_MODEL", "minilm")
BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072}
NAME = "pipeline"
ORDERS = {2048: ("wellfed", "trainer", "trainer", "wellfed")}
DEFAULT_ORDER = ("wellfed", "trainer")
TARGETS = {("pipeline", 2048): 0.75, ("pipeline", 20000): 1.05, ("iteration", 2048): 0.9}
LRS = ("9e-5", "8e-5", "1.1e-4", "1.2e-4")  # each iteration a new variant (no DVC run cache)


def git(project: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=b@b", "-c", "user.name=b", *args], cwd=project,
                   env=env(), check=True, capture_output=True)


def make_project(root: Path, rows: int) -> Path:
    """A scratch git + DVC repo of the pipeline with the first `rows` SST-2 train rows, SST-2
    dev as validation, no test split, 1 epoch, validation at the end only."""
    train_stage.make_project(root, rows)
    shutil.copytree(PROJECT / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((root / "params.yaml").read_text())
    if MODEL == "bert_base":  # a config beside MiniLM's tokenizer: random init on both sides
        model_dir = root / "bert_base"
        shutil.copytree(harness.model_path(), model_dir, ignore=shutil.ignore_patterns(
            "*.safetensors", "*.bin", "*.onnx", "onnx", "openvino"))
        config = json.loads((model_dir / "config.json").read_text())
        (model_dir / "config.json").write_text(json.dumps({**config, **BERT_BASE}))
        params["model"].update(name=str(model_dir), init="random")
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / ".gitignore").write_text("mlflow.db\nmlruns/\n/data/checkpoints/\n/hf_out/\n")
    git(root, "init", "-q")
    subprocess.run(["dvc", "init", "-q"], cwd=root, env=env(), check=True)
    subprocess.run(["dvc", "config", "core.analytics", "false"], cwd=root, env=env(), check=True)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "pipeline")
    return root


def budgets(project: Path) -> dict:
    """The stages' time budgets this run wrote (data/reports/time/), by stage."""
    return {p.stem: json.loads(p.read_text())
            for p in sorted((project / "data" / "reports" / "time").glob("*.json"))}


def wellfed_run(project: Path, cmd: list[str]) -> dict:
    seconds, out = timed(cmd, project)
    found = budgets(project)
    evaluate = found.get("evaluate", {})
    line = [s for s in out.splitlines() if s.startswith("[wellfed] pipeline ")]
    ran = {k: v for k, v in found.items()  # this run's stages only
           if v.get("dvc") and same_process(evaluate.get("dvc"), v["dvc"])}
    metrics = json.loads((project / "data" / "eval" / "metrics.json").read_text())
    return {"wall_s": round(seconds, 1), "pipeline_line": line[-1] if line else None,
            "stages_s": {k: v["total_s"] for k, v in ran.items()},
            "steps_s": ran.get("train", {}).get("parts_s", {}).get("steps"),
            "parts_s": {k: {p: round(s, 2) for p, s in v["parts_s"].items()}
                        for k, v in ran.items()},
            "val_accuracy": metrics.get("eval/accuracy")}


def trainer_run(project: Path, lr: str = "1e-4") -> dict:
    out_dir = project / "hf_out"
    shutil.rmtree(out_dir, ignore_errors=True)
    seconds, out = timed([sys.executable, str(HERE / "hf_trainer_script.py"),
                          "data/raw/train.tsv", "data/raw/dev.tsv", str(out_dir), "0", lr,
                          str(project / "bert_base") if MODEL == "bert_base" else ""], project)
    result = json.loads([s for s in out.splitlines() if s.startswith('{"phases"')][-1])
    return {"wall_s": round(seconds, 1), "lr": lr,
            "parts_s": {k: round(v, 1) for k, v in result["phases"].items()},
            "steps_s": round(result["phases"]["train (with evals)"], 1),
            "val_accuracy": result["val_accuracy"]}


def interleaved(kind: str, rows: int, project: Path) -> dict:
    runs = {"wellfed": [], "trainer": []}
    for n, side in enumerate(ORDERS.get(rows, DEFAULT_ORDER), 1):
        # the k-th iteration of each side at the same new lr: equal learning, pair by pair
        lr = LRS[len(runs[side])] if kind == "iteration" else "1e-4"
        if side == "trainer":
            record = trainer_run(project, lr)
        elif kind == "pipeline":
            record = wellfed_run(project, ["dvc", "repro", "--force"])
        else:
            record = {**wellfed_run(project, ["dvc", "exp", "run", "-S", f"train.lr={lr}"]),
                      "lr": lr}
        record["order"] = n
        runs[side].append(record)
        print(f"[bench] {kind} {rows} rows: run {n} {side}: {record['wall_s']} s, val accuracy "
              f"{record['val_accuracy']:.4f}", flush=True)
    mean = {side: sum(r["wall_s"] for r in rs) / len(rs) for side, rs in runs.items()}
    target = TARGETS.get((kind, rows))
    return {"runs": runs, "mean_wall_s": {k: round(v, 1) for k, v in mean.items()},
            "ratio": harness.ratio(mean["trainer"] / mean["wellfed"], target,
                                   of="trainer script seconds",
                                   over=f"wellfed {'dvc repro' if kind == 'pipeline' else 'dvc exp run -S train.lr'} seconds")}


def case(rows: int, scratch: Path) -> dict:
    measured = {"rows": rows, "measured_at": time.strftime("%Y-%m-%d %H:%M"), "commit": commit()}
    project = make_project(scratch / f"pipeline_{rows}", rows)
    out = {**measured, "pipeline": interleaved("pipeline", rows, project)}
    if rows <= 2048:
        project = make_project(scratch / f"iteration_{rows}", rows)
        timed(["dvc", "repro"], project)  # the full run the iteration comes after: untimed
        out["iteration"] = interleaved("iteration", rows, project)
    out["ratios"] = {f"{kind}_{rows}_rows": out[kind]["ratio"]
                     for kind in ("pipeline", "iteration") if kind in out}
    return out


def main() -> None:
    import torch

    harness.require_sst2(NAME)
    clock, gpu = harness.Clock(), torch.cuda.is_available()
    sizes = [int(a) for a in sys.argv[1:]] or [2048, 20_000]
    with tempfile.TemporaryDirectory(prefix="wellfed-pipeline-") as tmp:
        cases = [case(rows, Path(tmp)) for rows in sizes]
    cases = sorted(([] if gpu else kept_cases(sizes, NAME)) + cases, key=lambda c: c["rows"])
    ratios = {k: v for c in cases for k, v in c["ratios"].items()}
    harness.write_result(NAME if not gpu else f"{NAME}_{MODEL}", {
        "what": ("the whole pipeline (dvc repro) and the lr iteration (dvc exp run -S) vs an HF "
                 "Trainer script that trains and validates once, fresh processes, interleaved; "
                 "ratio = trainer s / wellfed s"),
        "cases": cases, "ratios": ratios,
        "all_met": all(r["met"] for r in ratios.values() if r["target"] is not None),
        "model": MODEL, "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "machine": harness.machine(), **clock.summary()},
        folder=harness.RESULTS / "gpu" if gpu else harness.RESULTS)


if __name__ == "__main__":
    main()
