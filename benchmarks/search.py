"""A search as a user waits for it: wellfed-search against the full grid at full budget and
against HF Trainer's `hyperparameter_search` (Optuna, its pruner on), on the same space and
SST-2 rows, each a fresh process timed from its start; every contender's chosen recipe then
retrained over the same seeds by the same code and compared over seeds and rows.

  search   `wellfed-search` in a scratch project (git + DVC; MiniLM; the first ROWS SST-2 train
           rows, SST-2 dev as validation): TRIALS trials, Optuna's TPE (5 random first), ASHA
           from MIN_STEPS to FULL steps (2 epochs), in warm Ray Tune
           workers (reduction factor WELLFED_BENCH_FACTOR, default 3: rungs at 16 and 48 steps);
           then its final check (the 2 best recipes x 3 seeds) and the winner's
           `dvc exp run` (equal learning: its last val/loss against its warm trial's).
  grid     benchmarks/search_grid.py: GRID's 16 recipes of the same space, each to FULL steps on
           the same warm workers (no scheduler), then the grid's best retrained over the seeds.
  trainer  benchmarks/hf_search_script.py: the same space, trials, TPE start and seed, Optuna's
           SuccessiveHalvingPruner with the same first rung and factor, evaluation at the same
           rungs; its best recipe retrained over the seeds by search_grid.py `retrain`.
Figures: search-phase wall (from process start to the chosen recipe) and steps against the
grid's and the Trainer's; the per-trial overhead (a trial's wall, start to end as the driver
sees it, minus its steps and validations); each chosen recipe's 3 seeds against the search's
winner's 3 seeds (wellfed-compare's two-way bootstrap over seeds and rows, validation split).
  asha     (WELLFED_BENCH_SIDES=search,trainer,asha) the same search one trial at a time with
           ASHA (search.fuse false); `search` itself runs with search.fuse auto (fused where the
           space and the device allow, else groups of one; successive halving in step across
           the search either way: the line the search printed is kept).
WELLFED_BENCH_SIDES picks and orders the sides (default search,grid,trainer);
WELLFED_BENCH_FUSE sets the `search` side's search.fuse (default auto; true: fused even where
auto measured one at a time faster, written to search_fuse-true.json); WELLFED_BENCH_NAME names
the result file instead (e.g. search_fused-vs-asha for SIDES=search,asha and FUSE=true).
Targets (issue 34): search steps <= 35% of the grid's, wall <= 40%; the Trainer >= 1.5x the
search's wall; median overhead <= 2 s; no chosen recipe better than the search's; equal
learning.

CONCURRENT trials at once with CPUS threads each (WELLFED_BENCH_CONCURRENT, default 2 x 1 on
this 2-core machine: Ray Tune runs two trials side by side; the Trainer runs one at a time on
both cores). WELLFED_BENCH_SMOKE=1: a tiny random-init model, 256 rows, 4 trials (a check of
this script, no figures). On a GPU (Ray, MLflow, DVC and Optuna installed) every side uses it.

usage: python benchmarks/search.py        -> benchmarks/results/search.json
       (WELLFED_BENCH_FACTOR=2: benchmarks/results/search_rf2.json)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import harness
import pipeline
from train_stage import HERE, commit, env

NAME = "search"
SMOKE = os.environ.get("WELLFED_BENCH_SMOKE") == "1"
FACTOR = int(os.environ.get("WELLFED_BENCH_FACTOR", "3"))
FUSE = os.environ.get("WELLFED_BENCH_FUSE", "auto")
ROWS, TRIALS, MIN_STEPS, FULL, SEEDS = ((256, 4, 4, 16, [1, 2]) if SMOKE else
                                        (2048, 16, 16, 128, [1, 2, 3]))
CONCURRENT = int(os.environ.get("WELLFED_BENCH_CONCURRENT", "2"))
SPACE = {"lr": [1e-5, 3e-4], "warmup": [0.0, 0.2], "weight_decay": [0.0, 0.01, 0.1]}
GRID = [{"train.lr": lr, "train.warmup_ratio": w, "train.weight_decay": d}
        for lr in (1e-5, 3e-5, 1e-4, 3e-4) for w in (0.0, 0.1) for d in (0.0, 0.1)]
"""16 recipes of the same space (each choice and range at a few points)."""


def project_at(root: Path) -> Path:
    project = pipeline.make_project(root, ROWS)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["train"].update(epochs=2, eval_every=0)
    params["ray"].update(cpus_per_worker=2 // CONCURRENT if CONCURRENT <= 2 else 1)
    params["search"].update(
        trials=TRIALS, min_steps=MIN_STEPS, max_steps=FULL, reduction_factor=FACTOR,
        finalists=2, seeds=SEEDS, concurrent=CONCURRENT, searcher_seed=0, space={"train": {
            "lr": f"log_uniform {SPACE['lr'][0]} {SPACE['lr'][1]}",
            "warmup_ratio": f"uniform {SPACE['warmup'][0]} {SPACE['warmup'][1]}",
            "weight_decay": "choice " + " ".join(map(str, SPACE["weight_decay"]))}})
    if SMOKE:
        model = project / "tiny"
        shutil.copytree(harness.model_path(), model, ignore=shutil.ignore_patterns(
            "*.safetensors", "*.bin", "onnx", "openvino"))
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "hidden_size": 32,
                                                       "num_hidden_layers": 2,
                                                       "num_attention_heads": 2,
                                                       "intermediate_size": 64}))
        params["model"].update(name=str(model), init="random")
        params["train"].update(global_batch_size=16, micro_batch_size=16)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    pipeline.git(project, "commit", "-qam", "search params")
    subprocess.run(["dvc", "repro", "tokenize"], cwd=project, env=env(), check=True,
                   capture_output=True)
    return project


def stamped(cmd: list[str], cwd: Path) -> tuple[float, list[tuple[float, str]]]:
    """Run `cmd`; (wall from its start, each output line with its time since the start)."""
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    lines = [(round(time.time() - start, 2), line.rstrip()) for line in proc.stdout]
    if proc.wait():
        tail = "\n".join(text for _, text in lines[-30:])
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{tail}")
    return round(time.time() - start, 1), lines


def at(lines, prefix: str) -> float | None:
    return next((t for t, text in lines if text.startswith(prefix)), None)


def with_fuse(project: Path, fuse: str) -> None:
    """search.fuse for the next search side (committed: the winner's `dvc exp run` starts from
    the project's HEAD)."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    if params["search"].get("fuse") != fuse:
        params["search"]["fuse"] = fuse
        (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        pipeline.git(project, "commit", "-qam", f"search.fuse {fuse}")


def search_side(project: Path, fuse: str = "auto") -> dict:
    with_fuse(project, fuse)
    wall, lines = stamped(["wellfed-search"], project)
    newest = max(project.glob("data/search/*/result.json"), key=lambda p: p.stat().st_mtime)
    result = json.loads(newest.read_text())
    folder = newest.parent
    entries = [json.loads(p.read_text()) for p in sorted((folder / "finished").glob("*.json"))]
    overhead = []
    for e in entries:
        timing = e["reports"][-1]["timing"]
        if "total" in timing:  # a fused group's: a trial spans a group per rung, and waits
            # between them for the other groups; its overhead is each group's own (model load,
            # setup), the group's wall inside its Ray task less its steps and validations
            groups = {json.dumps(r["timing"], sort_keys=True): r["timing"] for r in e["reports"]}
            overhead.append(sum(t["total"] - t.get("steps", 0) - t.get("validation", 0)
                                for t in groups.values()))
        else:
            overhead.append(e["wall_s"] - timing.get("steps", 0) - timing.get("validation", 0))
    winner = result["final_check"]["winner"]
    runs = [e["reports"][-1] for e in entries if e["phase"] == "proof"
            and e["config"]["proof"]["recipe"] == winner]
    return {
        "wall_s": wall, "search_phase_wall_s": at(lines, "[wellfed] final check: "),
        "final_check_end_s": at(lines, "[wellfed] the winner as a DVC experiment"),
        "steps": result["compute"]["steps"], "grid_equivalent_steps": result["compute"]["grid_steps"],
        "stopped_early": result["compute"]["stopped_early"],
        "best_trial": result["best_trial"], "final_check": {k: v for k, v in
                                                            result["final_check"].items()},
        "winner": winner, "winner_exp": result.get("winner_exp"), "fuse": fuse,
        "fused_line": next((text for _, text in lines if text.startswith(
            ("[wellfed] fused trials: ", "[wellfed] trials one at a time",
             "[wellfed] trials in groups of one"))), None),
        "equal_learning": result.get("equal_learning"),
        "overhead_s": {"median": round(statistics.median(overhead), 2),
                       "max": round(max(overhead), 2), "min": round(min(overhead), 2),
                       "trials": len(overhead),
                       "first_per_worker_included": True},
        "retrained": [{"seed": r["seed"], "val/macro_f1": r["val/macro_f1"],
                       "predicted": r.get("predicted")} for r in runs],
        "console_tail": [text for _, text in lines if text.startswith("[wellfed]")][-6:]}


def grid_side(project: Path) -> dict:
    wall, lines = stamped([sys.executable, str(HERE / "search_grid.py"), "grid",
                           json.dumps(GRID)], project)
    return json.loads([t for _, t in lines if t.startswith("[result] ")][-1][9:])


def trainer_side(project: Path) -> dict:
    spec = {"trials": TRIALS, "min_steps": MIN_STEPS, "full": FULL, "reduction_factor": FACTOR,
            "lr": SPACE["lr"], "warmup": SPACE["warmup"], "weight_decay": SPACE["weight_decay"],
            "searcher_seed": 0, "startup": max(3, min(10, TRIALS // 3)),
            "model_dir": str(project / "tiny") if SMOKE else ""}
    out_dir = project / "hf_out"
    wall, lines = stamped([sys.executable, str(HERE / "hf_search_script.py"), "data/raw/train.tsv",
                           "data/raw/dev.tsv", str(out_dir), json.dumps(spec)], project)
    found = json.loads([t for _, t in lines if t.startswith('{"wall_s"')][-1])
    _, lines = stamped([sys.executable, str(HERE / "search_grid.py"), "retrain",
                        json.dumps(found["best_recipe"])], project)
    found["retrain"] = json.loads([t for _, t in lines if t.startswith("[result] ")][-1][9:])
    return found


def compare(project: Path, other: list[dict], ours: list[dict]) -> dict:
    """The other side's chosen recipe (A) against the search's winner (B): wellfed-compare's
    two-way bootstrap over seeds and rows, on every retrained run's validation predictions."""
    from wellfed.compare.seed_significance import compare_groups
    from wellfed.search import driver, proof

    meta = json.loads((project / "data/tokens/meta.json").read_text())
    gold, row_ids = driver.validation(project / "data/tokens")
    labels = tuple(meta["labels"])

    def scored(runs, side):
        return proof.scored_runs([{**r, "trial": f"{side}-{r['seed']}", "recipe": {"side": side}}
                                  for r in runs], labels, gold, row_ids, {})

    result = compare_groups(scored(other, "other"), scored(ours, "search"))["macro_f1"]
    return {"other_mean": round(result["a"], 4), "search_mean": round(result["b"], 4),
            "search_minus_other": round(result["diff"], 4), "ci95": result["ci95"],
            "seeds_ci95": result["seeds_ci95"], "rows_ci95": result["rows_ci95"],
            "search_not_worse": result["ci95"][1] >= 0}


def main() -> None:
    harness.require_sst2(NAME)
    started = time.time()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="wellfed-bench-search-") as tmp:
        project = project_at(Path(tmp) / "project")
        sides = {}
        chosen = os.environ.get("WELLFED_BENCH_SIDES", "search,grid,trainer").split(",")
        every = {"search": lambda p: search_side(p, FUSE),
                 "asha": lambda p: search_side(p, "false"),
                 "grid": grid_side, "trainer": trainer_side}
        for name, side in ((n, every[n]) for n in chosen):
            print(f"[bench] {name} ...", flush=True)
            sides[name] = {"loadavg_at_start": os.getloadavg(), **side(project)}
            print(f"[bench] {name}: {json.dumps({k: v for k, v in sides[name].items() if 'wall' in k})}",
                  flush=True)
        s, g, t = sides["search"], sides.get("grid"), sides.get("trainer")
        ours = s["retrained"]
        figures = {"median_overhead_s": s["overhead_s"]["median"],
                   "equal_learning": s.get("equal_learning")}
        if g:
            figures.update(
                search_steps_share_of_grid=round(s["steps"] / g["grid_steps"], 3),
                search_wall_share_of_grid=round(s["search_phase_wall_s"] / g["grid_wall_s"], 3),
                vs_grid_best=compare(project, g["retrained"], ours))
        if t:
            figures.update(
                trainer_wall_over_search_wall=round(t["wall_s"] / s["search_phase_wall_s"], 2),
                whole_command_over_trainer_search=round(s["wall_s"] / t["wall_s"], 2),
                vs_trainer_best=compare(project, t["retrain"]["retrained"], ours))
        if "asha" in sides:
            a = sides["asha"]
            figures.update(
                asha_search_phase_over_fused=round(a["search_phase_wall_s"]
                                                   / s["search_phase_wall_s"], 2),
                asha_whole_over_fused=round(a["wall_s"] / s["wall_s"], 2),
                vs_asha_best=compare(project, a["retrained"], ours))
    targets = {"search_steps_share_of_grid": "<= 0.35", "search_wall_share_of_grid": "<= 0.40",
               "trainer_wall_over_search_wall": ">= 1.5", "median_overhead_s": "<= 2.0",
               "whole_command_over_trainer_search": "<= 1.3 (issue 40)",
               "chosen recipes": "the search's winner not worse (CI upper bound >= 0)",
               "equal_learning": "the same val/loss to 1e-4"}
    for side in sides.values():
        for run in side.get("retrained", []) + side.get("retrain", {}).get("retrained", []):
            run.pop("predicted", None)
    payload = {"machine": harness.machine(), "commit": commit(),
               "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "smoke": SMOKE, "rows": ROWS, "trials": TRIALS,
               "budget_steps": [MIN_STEPS, FULL], "reduction_factor": FACTOR, "seeds": SEEDS,
               "concurrent_trials": CONCURRENT, "space": SPACE, "grid": GRID,
               "figures": figures, "targets": targets, "sides": sides,
               "wall_s": round(time.time() - started, 1), "loadavg_at_start": load}
    if SMOKE:
        print(json.dumps(figures, indent=1))
        return
    name = NAME if FACTOR == 3 else f"{NAME}_rf{FACTOR}"
    name = name if FUSE == "auto" else f"{name}_fuse-{FUSE}"
    harness.write_result(os.environ.get("WELLFED_BENCH_NAME", name), payload)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
