"""A sweep's summary, on its parent run (`sweep <id>`, wellfed.track.sweeps): every evaluated
trial with its headline figure, each recipe's mean ± sd over its seeds, the best trial, and the
seed-aware verdict (wellfed.compare.seed_significance) of the best recipe against the runner-up.

A recipe is what the trials vary apart from their seed: the params whose values differ between
trials (`train.seed` left out). Two seeds of `train.lr=1e-4` are one recipe, `train.lr=3e-4`
another; a variant that inherited a stray `train.max_steps` from the workspace shows up as a
recipe of its own. The verdict needs two recipes of at least two evaluated trials each.

Each trial's evaluate stage brings the summary up to date as it finishes (`after_trial`), so the
last trial to finish leaves it whole; `wellfed-compare sweep:<id>` redoes it on demand. The
parent's description is the summary (MLflow's run note), its metrics `sweep/*` (and `vs_seeds/*`
with a verdict), its end time the last trial's.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from wellfed.compare import prediction_sources, seed_significance
from wellfed.compare.significance import RESAMPLES, SEED
from wellfed.track import registry, run_note, sweeps, tracking, ui_links

SEEDS = ("train.seed",)
"""Params that make another seed of a recipe, not another recipe."""
NOT_RECIPE = ("mlflow.", "predict.", "ray.", "data.loader_workers", "data.prefetch")
"""Params (prefixes) that make neither: where a run is logged, how `predict` runs, where and on
how many workers it trains (the global batch is the same), how fast its loader feeds it."""
TASKS = ("single_label", "multi_label", "regression")
PREFIX = "sweep/"


def headline(runs) -> str | None:
    """The headline figure the trials were evaluated by (eval/macro_f1, eval/pearson)."""
    keys = list(dict.fromkeys(registry.headline(task) for task in TASKS))
    return next((k for k in keys if any(k in r.data.metrics for r in runs)), None)


def runs_of(client, uri: str, sweep: str):
    """(the parent run, its trials oldest first) of `sweep`; a one-line FileNotFoundError when
    the store has no trial of it."""
    spec = f"{prediction_sources.SWEEP}{sweep}"
    ids = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(ids, f"tags.`{sweeps.SWEEP_TAG}` = '{sweep}'", max_results=50000,
                               order_by=["attributes.start_time ASC"]) if ids else []
    parents = [r for r in found if r.data.tags.get(sweeps.PARENT) == sweep]
    trials = [r for r in found if r.data.tags.get(sweeps.PARENT) != sweep]
    if not parents or not trials:
        raise FileNotFoundError(f"{spec}: no trial tagged {sweeps.SWEEP_TAG}={sweep!r} under a "
                                f"parent run in {uri}; name the sweep's id as "
                                "its trials were given it (mlflow.sweep)")
    return parents[0], trials


def recipe_keys(trials) -> list[str]:
    """The params whose values differ between trials (MLflow runs), seeds and NOT_RECIPE left
    out, sorted."""
    keys = set().union(*(r.data.params for r in trials))
    return sorted(k for k in keys if k not in SEEDS and not k.startswith(NOT_RECIPE)
                  and len({r.data.params.get(k) for r in trials}) > 1)


def recipes_in(uri: str, runs) -> dict:
    """Whether `runs` (prediction_sources.Scored, one side of a comparison over seeds) are
    seeds of one recipe: {"differ": {param: its distinct values}, "unchecked": the runs whose
    params are unknown (not MLflow runs: a folder, a git revision)}."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    known = [client.get_run(run.run_id) for run in runs if run.run_id]
    differ = {k: sorted({r.data.params.get(k, "(not logged)") for r in known})
              for k in recipe_keys(known)}
    return {"differ": differ, "unchecked": [run.ref for run in runs if not run.run_id]}


def mixed_line(side: str, runs: int, differ: dict) -> str:
    """"A's 2 runs are not seeds of one recipe: train.lr (0.001, 0.003), train.max_steps ..."."""
    shown = ", ".join(f"{k} ({', '.join(values)})" for k, values in differ.items())
    return (f"{side}'s {runs} runs are not seeds of one recipe: they differ in {shown}, not only "
            f"in {', '.join(SEEDS)}")


def summarise(uri: str, sweep: str, resamples: int = RESAMPLES, seed: int = SEED,
              repo: str | Path = ".") -> dict:
    """The sweep's summary, JSON-ready (module docstring)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    parent, trials = runs_of(client, uri, sweep)
    metric = headline(trials)
    varied = recipe_keys(trials)
    rows = []
    for run in trials:
        value = run.data.metrics.get(metric) if metric else None
        rows.append({"run_id": run.info.run_id, "name": run.info.run_name,
                     "status": run.info.status,
                     "recipe": " ".join(f"{k}={run.data.params.get(k, '')}" for k in varied),
                     "seed": run.data.params.get(SEEDS[0], ""),
                     "value": value if run.info.status == "FINISHED" else None,
                     "end_time": run.info.end_time})
    done = [r for r in rows if r["value"] is not None and math.isfinite(r["value"])]
    recipes = {}
    for row in done:
        recipes.setdefault(row["recipe"], []).append(row)
    table = [{"recipe": name, "trials": len(group),
              "mean": statistics.fmean(r["value"] for r in group),
              "sd": statistics.stdev(r["value"] for r in group) if len(group) > 1 else None,
              "best": max(r["value"] for r in group), "run_ids": [r["run_id"] for r in group]}
             for name, group in recipes.items()]
    summary = {"sweep": sweep, "parent_run_id": parent.info.run_id,
               "experiment_id": parent.info.experiment_id, "metric": metric, "varied": varied,
               "trials": rows, "evaluated": len(done), "recipes": table,
               "best": max(done, key=lambda r: r["value"]) if done else None}
    summary["verdict"], summary["comparison"] = verdict(table, uri, repo, resamples, seed)
    return summary


def verdict(recipes: list[dict], uri: str, repo, resamples: int, seed: int):
    """(the verdict in words, the group comparison or None): the best recipe by mean (B)
    against the runner-up (A), over seeds and rows, when both have two evaluated trials."""
    ranked = sorted((r for r in recipes if r["trials"] >= 2), key=lambda r: -r["mean"])
    if len(recipes) < 2:
        return ("one recipe: nothing in this sweep to compare it with; `wellfed-compare "
                "sweep:<other> --vs sweep:<this>` compares two sweeps over their seeds"), None
    if len(ranked) < 2:
        return ("no verdict over seeds: it needs two recipes with at least two evaluated trials "
                "(seeds) each; queue more seeds (-S train.seed=...)"), None
    b, a = ranked[0], ranked[1]
    try:
        runs = {side: [prediction_sources.load(run_id, uri, repo) for run_id in group["run_ids"]]
                for side, group in (("a", a), ("b", b))}
        result = seed_significance.compare_groups(runs["a"], runs["b"], resamples, seed)
    except (ValueError, FileNotFoundError) as err:  # another task, another split: say why
        return f"no verdict over seeds: {err}", None
    result["a"]["recipe"], result["b"]["recipe"] = a["recipe"], b["recipe"]
    return f"B = {b['recipe']}, A = {a['recipe']}: {result['verdict']}", result


def shown(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def aligned(rows: list[list[str]], right: set[int]) -> list[str]:
    """Rows of cells as text columns, each as wide as its widest cell (the header included),
    the columns in `right` aligned right (numbers)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


def lines(summary: dict, markdown: bool) -> list[str]:
    """The summary in reading order: the best recipe (its mean over its trials) first, then
    the recipes, the verdict and the trials."""
    metric, best = summary["metric"] or "the headline", summary["best"]
    head = f"sweep {summary['sweep']}: no trial evaluated yet"
    if best:
        # the best mean over seeds (a recipe with 2+ trials), before one trial's luck
        seeded = [r for r in summary["recipes"] if r["trials"] >= 2] or summary["recipes"]
        top = max(seeded, key=lambda r: r["mean"])
        spread = f" ± {top['sd']:.4f}" if top["sd"] is not None else ""
        what = ", ".join(part for part in (best["recipe"], f"seed {best['seed']}") if part)
        head = (f"sweep {summary['sweep']}: best recipe {top['recipe'] or '(the one recipe)'} "
                f"{metric} {top['mean']:.4f}{spread}, the mean of its {top['trials']} "
                f"trial{'s' * (top['trials'] != 1)}; best trial {best['name']} "
                f"{best['value']:.4f} ({what})")
    head += f"; {summary['evaluated']} of {len(summary['trials'])} trials evaluated" + "".join(
        f", {n} {status.lower()}" for status, n in sorted(_statuses(summary["trials"]).items()))
    out = [f"### {head}" if markdown else head, ""]
    # A sweep of seeds alone varies no recipe key: no recipe column then (it would be all "-").
    varied = any(r["recipe"] for r in summary["trials"])
    if markdown:
        out += [f"| recipe | trials | {metric} mean ± sd | best |", "|---|---|---|---|"]
        out += [f"| {r['recipe'] or '(one recipe)'} | {r['trials']} | {r['mean']:.4f} ± "
                f"{shown(r['sd'])} | {r['best']:.4f} |" for r in summary["recipes"]]
    else:
        out += aligned([["recipe", "trials", f"{metric} mean ± sd", "best"]] + [
            [r["recipe"] or "(one recipe)", str(r["trials"]),
             f"{r['mean']:.4f} ± {shown(r['sd'])}", f"{r['best']:.4f}"]
            for r in summary["recipes"]], right={1, 3})
    out += ["", ("**verdict** " if markdown else "verdict: ") + summary["verdict"], ""]
    if markdown:
        out += ["| trial | " + "recipe | " * varied + "seed | " + metric + " | status |",
                "|---|" + "---|" * varied + "---|---|---|"]
        route = ui_links.run_route
        out += [f"| [{r['name']}]({route(summary['experiment_id'], r['run_id'])}) | "
                + f"{r['recipe']} | " * varied
                + f"{r['seed']} | {shown(r['value'])} | {r['status']} |"
                for r in summary["trials"]]
    else:
        out += aligned([["trial"] + ["recipe"] * varied + ["seed", metric, "status"]] + [
            [r["name"]] + [r["recipe"]] * varied + [str(r["seed"]), shown(r["value"]),
                                                   r["status"]]
            for r in summary["trials"]], right={1 + varied, 2 + varied})
    return out


def _statuses(trials: list[dict]) -> dict[str, int]:
    """How many trials are not finished, by status (RUNNING, FAILED, KILLED)."""
    out: dict[str, int] = {}
    for row in trials:
        if row["status"] != "FINISHED":
            out[row["status"]] = out.get(row["status"], 0) + 1
    return out


def metrics(summary: dict) -> dict[str, float]:
    """The parent run's figures: trials evaluated, recipes, the best trial's headline, each
    recipe's mean and sd (numbered as the description's table), and `vs_seeds/*`."""
    metric = summary["metric"]
    out = {f"{PREFIX}trials": summary["evaluated"], f"{PREFIX}recipes": len(summary["recipes"])}
    if summary["best"]:
        out[f"{PREFIX}best/{metric}"] = summary["best"]["value"]
    for i, recipe in enumerate(summary["recipes"], 1):
        out[f"{PREFIX}recipe{i}/mean/{metric}"] = recipe["mean"]
        if recipe["sd"] is not None:
            out[f"{PREFIX}recipe{i}/sd/{metric}"] = recipe["sd"]
    if summary["comparison"]:
        out.update(seed_significance.tracked(summary["comparison"]))
    return out


def record(uri: str, summary: dict) -> bool:
    """Write the summary onto the parent run: description, metrics (at step = trials
    evaluated), tag of the recipe keys, end time. Under the store's lock, and only when no
    later summary (more trials) is there already: trials finishing together may race."""
    import mlflow
    from mlflow.entities import Metric

    client = mlflow.MlflowClient(uri)
    parent = summary["parent_run_id"]
    step = summary["evaluated"]
    with tracking.store_lock(uri):
        if client.get_run(parent).data.metrics.get(f"{PREFIX}trials", -1) > step:
            return False
        now = int(time.time() * 1000)
        tracking.send_metrics(uri, parent, [Metric(k, float(v), now, step)
                                            for k, v in metrics(summary).items()])
        client.set_tag(parent, run_note.NOTE, "\n".join(lines(summary, markdown=True)) + "\n")
        client.set_tag(parent, "wellfed.sweep.recipe_keys", ", ".join(summary["varied"]) or "-")
        ends = [r["end_time"] for r in summary["trials"] if r["end_time"]]
        client.set_terminated(parent, "FINISHED", end_time=max(ends) if ends else None)
    return True


def after_trial(uri: str, run_id: str) -> str:
    """The evaluate stage's part: when run `run_id` is a sweep's trial, bring the sweep's
    summary up to date; return the console line ("" for no sweep), its link offered as the
    run's line before it offers its own (ui_links.offered). A failure is a warning line: the
    trial's own outputs are all written."""
    import mlflow

    from wellfed.cli import one_line

    try:
        sweep = mlflow.MlflowClient(uri).get_run(run_id).data.tags.get(sweeps.SWEEP_TAG)
        if not sweep:
            return ""
        summary = summarise(uri, sweep)
        record(uri, summary)
        best, page = summary["best"], ui_links.offered(uri, ui_links.run(
            uri, summary["experiment_id"], summary["parent_run_id"]), again=True)
        return (f"sweep {sweep}: {summary['evaluated']} trial(s) evaluated, best {best['name']} "
                f"{summary['metric']} {best['value']:.4f}; the sweep's run summarises them: "
                f"{page}")
    except Exception as err:
        return (f"WARNING: the sweep's summary was not updated ({type(err).__name__}: "
                f"{one_line(str(err))[:300]}); `wellfed-compare sweep:<id>` redoes it")
