"""`make run`'s pipeline before and after a change: the offline default (`dvc repro --force` on
the demo data, every stage a fresh process, the MLflow run and registry included) at two git
revisions of this project, interleaved A B A B, each in a scratch copy of its own revision
(`git archive`) with that revision's `src` first on PYTHONPATH.

For each run: the wall time of the whole `dvc repro`, the train stage's steps (its time line)
and so the pipeline's fixed cost (wall minus steps), and the stages' time budgets where the
revision writes them (data/reports/time/). The ratio is before / after (>= 1: faster now).
Target (issue: a run as fast as its steps): the fixed cost <= 25 s on this 2-core CPU.

usage: python benchmarks/make_run.py BEFORE_REV [AFTER_REV] [PAIRS]    (default: HEAD, 3 pairs)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
from train_stage import PROJECT, env

NAME = "make_run"
STEPS = re.compile(r"\[wellfed\] train(?: stage)? [\d.]+ s: .*?\bsteps ([\d.]+)")
FIXED_TARGET_S = 25.0


def checkout(rev: str, root: Path) -> Path:
    """A scratch git + DVC project of the project at `rev` (its tracked files)."""
    root.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=PROJECT, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=b@b", "-c", "user.name=b", "commit", "-q", "-m", rev]):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)
    return root


def run(project: Path) -> dict:
    cmd_env = {**env(), "PYTHONPATH": str(project / "src")}
    start = time.perf_counter()
    proc = subprocess.run(["dvc", "repro", "--force"], cwd=project, env=cmd_env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"dvc repro failed in {project}:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    out = proc.stdout + proc.stderr
    steps = float(STEPS.search(out).group(1))
    budgets = {p.stem: {k: round(v, 2) for k, v in json.loads(p.read_text())["parts_s"].items()}
               for p in sorted((project / "data/reports/time").glob("*.json"))}
    metrics = json.loads((project / "data/eval/metrics.json").read_text())
    return {"wall_s": round(wall, 1), "steps_s": steps, "fixed_s": round(wall - steps, 1),
            "parts_s": budgets, "eval_macro_f1": metrics.get("eval/macro_f1")}


def main() -> None:
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__.strip().splitlines()[-1])
    before, after = args[0], args[1] if len(args) > 1 and not args[1].isdigit() else "HEAD"
    pairs = int(args[-1]) if args[-1].isdigit() else 3
    revs = {side: subprocess.run(["git", "rev-parse", "--short", rev], cwd=PROJECT, check=True,
                                 capture_output=True, text=True).stdout.strip()
            for side, rev in (("before", before), ("after", after))}
    clock, runs = harness.Clock(), {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="wellfed-make-run-") as tmp:
        projects = {side: checkout(rev, Path(tmp) / side) for side, rev in revs.items()}
        for n in range(pairs):
            for side in ("before", "after"):
                record = {**run(projects[side]), "order": 2 * n + (side == "after") + 1}
                runs[side].append(record)
                print(f"[bench] make_run {side} ({revs[side]}): {record['wall_s']} s, steps "
                      f"{record['steps_s']} s, fixed {record['fixed_s']} s", flush=True)
    mean = {side: sum(r["wall_s"] for r in rs) / len(rs) for side, rs in runs.items()}
    fixed = {side: sum(r["fixed_s"] for r in rs) / len(rs) for side, rs in runs.items()}
    ratios = {
        "speed": harness.ratio(mean["before"] / mean["after"], None,
                               of=f"dvc repro seconds at {revs['before']}",
                               over=f"dvc repro seconds at {revs['after']}"),
        "fixed_cost_s": harness.ratio(fixed["after"], FIXED_TARGET_S,
                                      of=f"fixed seconds (wall - steps) at {revs['after']}",
                                      over="1 s", higher_is_better=False)}
    harness.write_result(NAME, {
        "what": "make run's dvc repro --force on the demo at two revisions, interleaved; "
                "fixed cost = wall - the train stage's steps",
        "revisions": revs, "runs": runs, "mean_wall_s": {k: round(v, 1) for k, v in mean.items()},
        "mean_fixed_s": {k: round(v, 1) for k, v in fixed.items()}, "ratios": ratios,
        "measured_at": time.strftime("%Y-%m-%d %H:%M"), "machine": harness.machine(),
        **clock.summary()})


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
