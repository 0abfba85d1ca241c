"""The winner, proven: the best recipes of the search retrained at full budget over several
seeds, and the seed-aware comparison of the best against the runner-up.

A search ranks each recipe on one seed, and the top of a ranking of noisy figures is biased
upward (the winner's curse): the first-ranked recipe is often first by luck. So the finalists
(the `search.finalists` best, by the rung they reached and then their figure) are each trained
again once per seed in `search.seeds`, and compared on the validation split:

- single-label with an accuracy or macro-F1 metric: wellfed-compare's two-way bootstrap over
  seeds and rows (compare/seed_significance.py), on every run's validation predictions;
- any other metric: a bootstrap of the seeds alone (each run's figure), said as such.

The winner is the finalist with the best mean over the seeds. The verdict says whether it
beats the runner-up (the interval excludes 0) or whether the two are indistinguishable (then
either recipe is as good, within what the seeds and rows can tell). The test split is not
looked at: it stays for the winner's evaluate stage.
"""

from __future__ import annotations

import numpy as np

from wellfed.search import space

RESAMPLES, SEED = 2000, 0


def ranked(reports: dict[str, list], configs: dict[str, dict], metric: str,
           lower: bool) -> list[dict]:
    """Search trials best first: by the step they reached (a trial that went further beat the
    others at every rung it passed), then by the figure there. Each: trial, recipe, step,
    value."""
    from wellfed.search.space import recipe_of

    rows = []
    for trial, found in reports.items():
        scored = [r for r in found if metric in r]
        if not scored or trial not in configs:
            continue
        last = scored[-1]
        rows.append({"trial": trial, "recipe": recipe_of(configs[trial])[0],
                     "step": int(last["step"]), "value": float(last[metric])})
    sign = 1.0 if lower else -1.0
    return sorted(rows, key=lambda r: (-r["step"], sign * r["value"]))


def finalists(rows: list[dict], count: int) -> list[dict]:
    """The `count` best distinct recipes of `rows` (TPE may propose a recipe twice)."""
    out, seen = [], set()
    for row in rows:
        key = space.recipe_id(row["recipe"])
        if key not in seen:
            seen.add(key)
            out.append(row)
        if len(out) == count:
            break
    return out


def proof_configs(chosen: list[dict], seeds: list[int]) -> list[dict]:
    """The final check's trials: every finalist once per seed."""
    return [{"recipe": row["recipe"], "seed": seed, "finalist": i}
            for i, row in enumerate(chosen) for seed in seeds]


def groups(reports: dict[str, list], configs: dict[str, dict], metric: str) -> list[list[dict]]:
    """The final check's last reports, grouped by finalist, each with its run's trial id."""
    out: dict[int, list[dict]] = {}
    for trial, found in reports.items():
        config = configs.get(trial, {}).get("proof")
        scored = [r for r in found if metric in r]
        if config is None or not scored:
            continue
        out.setdefault(int(config["finalist"]), []).append(
            {**scored[-1], "trial": trial, "recipe": config["recipe"], "seed": config["seed"]})
    return [sorted(out[k], key=lambda r: r["seed"]) for k in sorted(out)]


def seed_interval(a: np.ndarray, b: np.ndarray) -> list[float]:
    """95% interval of mean(b) - mean(a), resampling each group's runs (seeds) alone."""
    rng = np.random.default_rng(SEED)
    da = a[rng.integers(0, len(a), (RESAMPLES, len(a)))].mean(1)
    db = b[rng.integers(0, len(b), (RESAMPLES, len(b)))].mean(1)
    return [float(v) for v in np.percentile(db - da, [2.5, 97.5])]


def scored_runs(group: list[dict], labels: tuple, gold: np.ndarray, row_ids: np.ndarray,
                runs: dict[str, str]):
    """A finalist's runs as wellfed-compare's Scored (validation predictions)."""
    import pandas as pd

    from wellfed.compare.prediction_sources import Scored
    from wellfed.search.trial import decode

    names = np.asarray(labels)
    out = []
    for r in group:
        frame = pd.DataFrame({"row_id": row_ids, "gold": names[gold],
                              "predicted": names[decode(r["predicted"])]})
        out.append(Scored(ref=f"{space.recipe_id(r['recipe'])} seed {r['seed']}",
                          source=f"search trial {r['trial']}", frame=frame,
                          report={"task": "single_label", "split": "validation"},
                          run_id=runs.get(r["trial"])))
    return out


def verdict(finals: list[list[dict]], metric: str, lower: bool, task: str, labels: tuple,
            gold: np.ndarray, row_ids: np.ndarray, runs: dict[str, str]) -> dict:
    """Which finalist wins over the seeds, and whether it beats the runner-up."""
    means = [float(np.mean([r[metric] for r in g])) for g in finals]
    order = sorted(range(len(finals)), key=lambda i: means[i] if lower else -means[i])
    out = {"metric": metric, "finalists": [
        {"recipe": finals[i][0]["recipe"], "mean": means[i],
         "sd": float(np.std([r[metric] for r in finals[i]], ddof=1)) if len(finals[i]) > 1
         else 0.0, "runs": [{"seed": r["seed"], metric: r[metric], "trial": r["trial"]}
                            for r in finals[i]]} for i in order]}
    out["winner"] = out["finalists"][0]["recipe"]
    if len(finals) < 2:
        out.update(call="alone", text="one finalist: nothing to compare it with "
                   "(search.finalists: 1)")
        return out
    win, runner = finals[order[0]], finals[order[1]]
    name = metric.removeprefix("val/")
    paired = task == "single_label" and name in ("accuracy", "macro_f1") and all(
        "predicted" in r for r in win + runner)
    if paired:
        from wellfed.compare.seed_significance import compare_groups

        result = compare_groups(scored_runs(runner, labels, gold, row_ids, runs),
                                scored_runs(win, labels, gold, row_ids, runs),
                                RESAMPLES, SEED)
        diff, ci, how = result[name]["diff"], result[name]["ci95"], "seeds and rows"
    else:
        a = np.array([r[metric] for r in runner])
        b = np.array([r[metric] for r in win])
        diff, ci, how = float(b.mean() - a.mean()), seed_interval(a, b), "seeds only"
    better = (ci[1] < 0) if lower else (ci[0] > 0)
    call = "beats" if better else "indistinguishable"
    n_a, n_b = len(runner), len(win)
    told = (f"the winner ({space.shown(out['winner'])}) beats the runner-up "
            f"({space.shown(out['finalists'][1]['recipe'])})" if better else
            f"the winner ({space.shown(out['winner'])}) and the runner-up "
            f"({space.shown(out['finalists'][1]['recipe'])}) are indistinguishable: either "
            f"recipe is as good within what the seeds and rows can tell")
    out.update(call=call, diff=diff, ci95=ci, interval_over=how, text=(
        f"{told}: {metric} {diff:+.4f} over {n_b} vs {n_a} seeds, 95% CI "
        f"[{ci[0]:+.4f}, {ci[1]:+.4f}] ({how}, validation split)"))
    return out
