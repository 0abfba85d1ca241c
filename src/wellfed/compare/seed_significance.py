"""Is recipe B better than recipe A over seeds? Two groups of runs (several seeds of each recipe)
that scored the same rows: B's mean minus A's mean, with an interval for both kinds of luck.

A fine-tuned model's test figure moves with the seed (initialisation, data order, dropout) and
with which rows ended up in the test split. The paired test of two runs (wellfed.compare.significance)
sees only the rows. Here every run scored every row, a crossed design (seeds x rows), and the 95%
interval of mean(B) - mean(A), for accuracy and macro-F1, comes from a two-way bootstrap:

- each resample draws seeds with replacement within each group (A's and B's apart), and rows
  with replacement once, the same rows for every run (they all scored the same rows);
- it recomputes each drawn run's figure on the drawn rows and takes the difference of the two
  groups' means (a run drawn twice counts twice); the 2.5th and 97.5th percentiles of the
  differences are the interval.

No bootstrap of a crossed design is exact (McCullagh 2000, Bernoulli 6, 285-301). Resampling
seeds and rows independently is the "pigeonhole" bootstrap: it errs toward a wider interval,
never a narrower one (Owen 2007, Ann. Appl. Stat. 1, 386-411; Owen and Eckles 2012, "mildly
conservative"), because a run's own hits and misses (the seed x row interaction) are counted by
both draws. A "B is better" from it survives both sources of luck.

The same draws give the two sources apart: "rows" keeps every run and resamples the rows (the
row-level interval, as a paired test of the pooled runs would see it), "seeds" keeps all rows
and resamples the seeds (the spread of the group means from seed to seed). The verdict compares
their variances.
"""

from __future__ import annotations

import numpy as np

from wellfed.compare.prediction_sources import Scored
from wellfed.compare.significance import (CELLS, HEADLINE, NAMES, RESAMPLES, SEED, align,
                                          macro_f1, named, points)

METRICS = ("accuracy", "macro_f1")
SOURCES = ("both", "rows", "seeds")
VS = "vs_seeds/"
"""The group comparison's metric keys (on its own MLflow run): not vs/, which on a run means the
paired comparison of that one run."""


def features(gold: np.ndarray, predicted: np.ndarray, classes: int):
    """What each run's figures sum over rows, as a sparse (columns x rows) matrix: per run a
    right column, its true positives per class and its predictions per class; then the gold
    class (shared). A resample's counts of each row, times this, give every figure at once."""
    from scipy.sparse import csr_matrix

    runs, n = predicted.shape
    width = 1 + 2 * classes
    run, row = np.nonzero(predicted == gold)
    every_run, every_row = np.divmod(np.arange(runs * n), n)
    columns = np.concatenate([run * width, run * width + 1 + gold[row],
                              every_run * width + 1 + classes + predicted.ravel(),
                              runs * width + gold])
    rows = np.concatenate([row, row, every_row, np.arange(n)])
    return csr_matrix((np.ones(len(rows)), (columns, rows)), shape=(runs * width + classes, n))


def figures(table, counts: np.ndarray, runs: int, classes: int) -> dict[str, np.ndarray]:
    """Each run's accuracy and macro-F1 (resamples x runs) on rows weighted by `counts`
    (resamples x rows: how often each row was drawn)."""
    sums = np.asarray(table @ counts.T.astype(np.float64)).T
    width = 1 + 2 * classes
    per_run = sums[:, :runs * width].reshape(len(counts), runs, width)
    gold = sums[:, None, runs * width:]
    return {"accuracy": per_run[..., 0] / counts.sum(1, keepdims=True),
            "macro_f1": macro_f1(per_run[..., 1:1 + classes], per_run[..., 1 + classes:], gold)}


def seed_weights(rng: np.random.Generator, runs: int, resamples: int) -> np.ndarray:
    """Per resample, each run's weight in its group's mean: how often it was drawn / runs."""
    drawn = rng.integers(0, runs, size=(resamples, runs)) + runs * np.arange(resamples)[:, None]
    return np.bincount(drawn.ravel(), minlength=resamples * runs).reshape(resamples, runs) / runs


def bootstrap(gold: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray, classes: int,
              resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, dict[str, np.ndarray]]:
    """mean(B) - mean(A) per metric on `resamples` draws, per source: "both" (seeds and rows:
    the interval reported), "rows" (every run kept), "seeds" (every row kept). `pred_a`, `pred_b`:
    one row of class ids per run. Draw order: A's seeds, B's seeds (all resamples), then rows."""
    runs_a, runs_b, n = len(pred_a), len(pred_b), len(gold)
    predicted = np.vstack([pred_a, pred_b])
    runs = len(predicted)
    table = features(gold, predicted, classes)
    rng = np.random.default_rng(seed)
    weight_a, weight_b = seed_weights(rng, runs_a, resamples), seed_weights(rng, runs_b, resamples)
    whole = figures(table, np.ones((1, n)), runs, classes)
    chunk = max(1, min(resamples, CELLS // max(n, 1)))  # 4M cells per chunk, as the paired test
    drawn = {metric: [] for metric in METRICS}
    for start in range(0, resamples, chunk):
        m = min(chunk, resamples - start)
        rows = rng.integers(0, n, size=(m, n), dtype=np.int32) + n * np.arange(m)[:, None]
        counts = np.bincount(rows.ravel(), minlength=m * n).reshape(m, n)
        for metric, values in figures(table, counts, runs, classes).items():
            drawn[metric].append(values)
    out = {}
    for metric in METRICS:
        on_rows, on_all = np.vstack(drawn[metric]), whole[metric][0]
        a_rows, b_rows = on_rows[:, :runs_a], on_rows[:, runs_a:]
        out[metric] = {"both": (weight_b * b_rows).sum(1) - (weight_a * a_rows).sum(1),
                       "rows": b_rows.mean(1) - a_rows.mean(1),
                       "seeds": weight_b @ on_all[runs_a:] - weight_a @ on_all[:runs_a]}
    return out


def compare_groups(a: list[Scored], b: list[Scored], resamples: int = RESAMPLES,
                   seed: int = SEED, mixed: list[str] | None = None) -> dict:
    """Everything the group comparison reports, JSON-ready: each run's figures, the groups'
    means, B - A with its two-way 95% interval, the row-only and seed-only intervals and the
    seed share of the variance, and a one-line verdict. Each group needs at least 2 runs.
    `mixed`: lines saying a group's runs differ in more than their seed (compared anyway):
    its spread is then not seed noise alone, and the table and verdict say so."""
    if min(len(a), len(b)) < 2:
        raise ValueError(f"A has {len(a)} run{'s' * (len(a) != 1)} and B {len(b)}: a "
                         f"comparison over seeds needs at least 2 runs on each side (one run's "
                         f"seed-to-seed spread is unknown); add seeds, or compare two single runs")
    named = [(f"A{i}", run) for i, run in enumerate(a, 1)] + \
            [(f"B{i}", run) for i, run in enumerate(b, 1)]
    seen = {}
    for name, run in named:
        key = run.run_id or run.source
        if key in seen:
            raise ValueError(f"{seen[key]} and {name} are the same run ({key}); name each "
                             f"seed's run once")
        seen[key] = name
    _, gold, predicted, labels = align(named)
    k = len(labels)
    whole = figures(features(gold, predicted, k), np.ones((1, len(gold))), len(predicted), k)
    diffs = bootstrap(gold, predicted[:len(a)], predicted[len(a):], k, resamples, seed)
    result = {"task": "single_label", "split": next(
                  (r.report["split"] for _, r in named if r.report.get("split")), None),
              "rows": int(len(gold)), "classes": k, "mixed": list(mixed or []),
              "bootstrap": {"resamples": resamples, "seed": seed, "level": 0.95,
                            "kind": "two-way: seeds within each group, rows shared by all runs"}}
    for side, runs, columns in (("a", a, slice(0, len(a))), ("b", b, slice(len(a), None))):
        result[side] = {"runs": [
            {"ref": run.ref, "source": run.source, "mlflow_run_id": run.run_id,
             **{m: float(whole[m][0, columns][i]) for m in METRICS}}
            for i, run in enumerate(runs)]}
    for metric in METRICS:
        values = whole[metric][0]
        a_mean, b_mean = values[:len(a)].mean(), values[len(a):].mean()
        d = diffs[metric]
        shares = {s: float(np.var(d[s])) for s in ("seeds", "rows")}
        result[metric] = {
            "a": float(a_mean), "b": float(b_mean), "diff": float(b_mean - a_mean),
            "a_sd": float(values[:len(a)].std(ddof=1)), "b_sd": float(values[len(a):].std(ddof=1)),
            **{("ci95" if s == "both" else f"{s}_ci95"): interval(d[s]) for s in SOURCES},
            "seed_share": shares["seeds"] / sum(shares.values()) if sum(shares.values()) else None}
    result["verdict_metric"] = HEADLINE
    result["verdict"] = verdict(result, len(a), len(b))
    return result


def interval(values: np.ndarray) -> list[float]:
    return [float(v) for v in np.percentile(values, [2.5, 97.5])]


def half_width(ci: list[float]) -> float:
    return (ci[1] - ci[0]) / 2


def verdict(result: dict, runs_a: int, runs_b: int) -> str:
    """'B - A macro-F1 (the headline) +1.2 pt over 3 vs 3 seeds, 95% CI [-0.8, +3.1]: within
    noise; the seed-to-seed spread (±1.4 pt) dominates the row sampling (±0.6 pt): run more
    seeds'.

    On the task's headline (macro-F1: what the champion and the search rank on). Within noise
    when its two-way interval holds 0. The source with the larger
    bootstrap variance dominates (each shown as its own interval's half-width); when within
    noise, the advice follows it: more seeds narrow the seed term, a larger test split the rows'.
    """
    headline = result[HEADLINE]
    low, high = headline["ci95"]
    call = "within noise" if low <= 0 <= high else "B is better" if low > 0 else "B is worse"
    seeds = f"the seed-to-seed spread (±{100 * half_width(headline['seeds_ci95']):.1f} pt)"
    rows = f"the row sampling (±{100 * half_width(headline['rows_ci95']):.1f} pt)"
    share = headline["seed_share"]
    if share is None:
        noise = "no spread from seeds or rows"
    elif share >= 0.5:
        noise = f"{seeds} dominates {rows}" + (": run more seeds" if call == "within noise" else "")
    else:
        noise = f"{rows} dominates {seeds}" + (
            ": a larger test split would narrow it more than seeds" if call == "within noise"
            else "")
    if result.get("mixed"):  # another recipe's runs are not seeds: "seed" figures mix both
        noise = noise.replace("seed-to-seed spread", "run-to-run spread (recipes mixed)")
        return (f"B - A {named(HEADLINE)} {100 * headline['diff']:+.1f} pt over {runs_a} vs "
                f"{runs_b} runs of mixed recipes, 95% CI [{100 * low:+.1f}, {100 * high:+.1f}]: "
                f"{call}; {noise}")
    return (f"B - A {named(HEADLINE)} {100 * headline['diff']:+.1f} pt over {runs_a} vs "
            f"{runs_b} seeds, 95% CI [{100 * low:+.1f}, {100 * high:+.1f}]: {call}; {noise}")


def table(result: dict) -> str:
    """The console summary: each run with its figures, the group means with B - A and the
    three intervals, the variance shares, the verdict."""
    boot = result["bootstrap"]
    lines = [f"{'':4}{'accuracy':>9}{'macro-F1':>9}  run"]
    for side in ("a", "b"):
        for i, run in enumerate(result[side]["runs"], 1):
            lines.append(f"{side.upper()}{i:<3}{run['accuracy']:9.4f}{run['macro_f1']:9.4f}  "
                         f"{run['source']}")
    lines += [f"{result['split'] or 'same'} split, {result['rows']} rows matched by row_id in "
              f"every run; two-way bootstrap {boot['resamples']:,} resamples of seeds and rows "
              f"(seed {boot['seed']})", "",
              f"{'':10}{'A mean':>8}{'B mean':>8}{'B - A (pt)':>12}  {'95% CI (pt)':17}"
              f"{'rows only':17}seeds only"]
    for metric, name in (("accuracy", "accuracy"), ("macro_f1", "macro-F1")):
        m = result[metric]
        ends = [f"[{points(m[key][0])}, {points(m[key][1])}]"
                for key in ("ci95", "rows_ci95", "seeds_ci95")]
        lines.append(f"{name:10}{m['a']:8.4f}{m['b']:8.4f}{points(m['diff']):>12}  "
                     f"{ends[0]:17}{ends[1]:17}{ends[2]}")
    headline = result[HEADLINE]  # the verdict's figure
    share = headline["seed_share"]
    if share is not None:
        lines += ["", f"{NAMES[HEADLINE]} variance: seeds {100 * share:.0f}%, rows "
                      f"{100 - 100 * share:.0f}% (sd over seeds: A {100 * headline['a_sd']:.2f} "
                      f"pt, B {100 * headline['b_sd']:.2f} pt)"]
    lines += [f"WARNING: {line}: the seeds-only figures count recipe differences as seed noise"
              for line in result.get("mixed", [])]
    lines += ["", f"verdict: {result['verdict']}"]
    return "\n".join(lines)


def tracked(result: dict) -> dict[str, float]:
    """The comparison as MLflow metrics, under `vs_seeds/`."""
    out = {}
    for metric in METRICS:
        m = result[metric]
        out.update({f"{VS}{metric}_diff": m["diff"], f"{VS}{metric}_diff_ci_low": m["ci95"][0],
                    f"{VS}{metric}_diff_ci_high": m["ci95"][1],
                    f"{VS}{metric}_rows_ci_low": m["rows_ci95"][0],
                    f"{VS}{metric}_rows_ci_high": m["rows_ci95"][1],
                    f"{VS}{metric}_seeds_ci_low": m["seeds_ci95"][0],
                    f"{VS}{metric}_seeds_ci_high": m["seeds_ci95"][1]})
        if m["seed_share"] is not None:
            out[f"{VS}{metric}_seed_share"] = m["seed_share"]
    out.update({f"{VS}runs_a": len(result["a"]["runs"]), f"{VS}runs_b": len(result["b"]["runs"]),
                f"{VS}rows": result["rows"]})
    return out
