"""Is run B really better than run A? Paired statistics over the rows both runs scored.

Two runs evaluated on the same split predict the same rows, so the honest comparison is paired:
row by row, which predictions flipped from right to wrong and back. From the pairs come

- flip counts (right->wrong, wrong->right) and the first few row ids of each, to read;
- McNemar's exact test: under "A and B are equally good" each discordant row is a fair coin, so
  the right->wrong count is Binomial(discordant, 1/2) (scipy.stats.binomtest, two-sided);
- a paired bootstrap 95% interval for B - A accuracy and macro-F1: resample rows with
  replacement (the same rows for both runs), recompute both figures, take the 2.5th and 97.5th
  percentiles of the differences.

A run's predictions are its evaluate stage's `predictions.parquet` with `report.json` beside it
(task, split, label list), found by wellfed.compare.prediction_sources. Single-label only for now.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wellfed.compare.prediction_sources import Scored
from wellfed.tasks import HEADLINE as HEADLINE_OF

RESAMPLES = 2000  # percentile-interval ends move by ~0.1 pt between seeds at 1,000 rows
SEED = 0
SHOWN_ROWS = 10  # row ids listed per flip direction: enough to open and read, not a dump
# Rows drawn per bootstrap chunk: 4M int32 draws = 16 MB (plus their int64 cells, 32 MB),
# whatever the row count. 2,000 resamples took 0.05 s for 872 rows and 11 s for 100k rows of 10
# classes on a 2-core CPU shared with other jobs (load ~9).
CELLS = 1 << 22
VS = "vs/"
"""The comparison's metric keys on run B: vs/accuracy_diff, ..."""
HEADLINE = HEADLINE_OF["single_label"].removeprefix("val/")
"""The figure the verdict judges: the task's headline (macro-F1 for single-label), the one the
champion, the headline view and the search rank on. Accuracy is shown beside it."""
NAMES = {"accuracy": "accuracy", "macro_f1": "macro-F1"}


def task_of(scored: Scored) -> str:
    """The run's task from its report, else from the shape of its predictions."""
    if "task" in scored.report:
        return scored.report["task"]
    frame = scored.frame
    if "gold" not in frame:
        return "regression"
    return "multi_label" if frame["gold"].map(lambda v: isinstance(v, (list, np.ndarray))).any() \
        else "single_label"


def pair(a: Scored, b: Scored) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list]:
    """(row ids, gold, A's, B's predictions as class ids, label list) over the rows both scored,
    in A's order; a one-line ValueError when they did not score the same rows."""
    row_ids, gold, predicted, labels = align([("A", a), ("B", b)])
    return row_ids, gold, predicted[0], predicted[1], labels


def align(runs: list[tuple[str, Scored]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """(row ids, gold, predictions as class ids with one row per run, label list) over the rows
    every (name, run) scored, in the first run's order; a one-line ValueError naming the two
    runs that differ when they did not all score the same rows of the same split."""
    for name, run in runs:
        task = task_of(run)
        if task != "single_label":
            raise ValueError(f"{name} ({run.ref}) is a {task} run: compare is not supported yet "
                             f"for {task} (single_label only)")
        missing = {"row_id", "gold", "predicted"} - set(run.frame.columns)
        if missing:
            raise ValueError(f"{name} ({run.source}): predictions lack {sorted(missing)}; "
                             f"re-run its evaluate stage")
        if run.frame["row_id"].duplicated().any():
            raise ValueError(f"{name} ({run.source}): row_id repeats; re-run its evaluate stage")
    what = "two runs" if len(runs) == 2 else "runs"
    splits = [(name, run.report["split"]) for name, run in runs if run.report.get("split")]
    for name, split in splits[1:]:
        if split != splits[0][1]:
            raise ValueError(f"{splits[0][0]} scored the {splits[0][1]} split and {name} the "
                             f"{split} split; compare {what} evaluated on the same split")
    first_name, first = runs[0]
    order = first.frame["row_id"].to_numpy()
    gold = first.frame["gold"].astype(str).to_numpy()
    predicted = []
    for name, run in runs:
        ids_first, ids = set(order), set(run.frame["row_id"])
        if ids != ids_first:
            raise ValueError(
                f"{first_name} and {name} scored different rows ({first_name} {len(ids_first)}, "
                f"{name} {len(ids)}, {len(ids_first & ids)} shared); compare {what} evaluated on "
                f"the same split of the same prepared data")
        rows = run.frame.set_index("row_id").loc[order]
        differ = rows["gold"].astype(str).to_numpy() != gold
        if differ.any():
            raise ValueError(f"{first_name} and {name} give different gold labels for "
                             f"{int(differ.sum())} rows (first: row_id {order[differ][0]}); they "
                             f"scored different data")
        predicted.append(rows["predicted"].astype(str).to_numpy())
    # Macro-F1 over every class of the run (as evaluate reports it), not only those seen here.
    labels = [c["label"] for c in first.report.get("per_class", {}).values()]
    labels += sorted(set(gold).union(*predicted) - set(labels))
    index = pd.Index(labels)
    return order, index.get_indexer(gold), index.get_indexer(np.concatenate(predicted)).reshape(
        len(runs), -1), labels


def flips(gold: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray, row_ids: np.ndarray,
          shown: int = SHOWN_ROWS) -> dict:
    """Rows each run got right or wrong, and the first `shown` row ids that changed."""
    right_a, right_b = pred_a == gold, pred_b == gold
    broke, fixed = right_a & ~right_b, ~right_a & right_b
    return {"right_to_wrong": int(broke.sum()), "wrong_to_right": int(fixed.sum()),
            "both_right": int((right_a & right_b).sum()),
            "both_wrong": int((~right_a & ~right_b).sum()),
            "right_to_wrong_rows": row_ids[broke][:shown].tolist(),
            "wrong_to_right_rows": row_ids[fixed][:shown].tolist()}


def mcnemar_p(right_to_wrong: int, wrong_to_right: int) -> float:
    """McNemar's exact two-sided p-value: the discordant rows as fair coin flips."""
    from scipy.stats import binomtest

    n = right_to_wrong + wrong_to_right
    return 1.0 if n == 0 else float(binomtest(right_to_wrong, n, 0.5).pvalue)


def macro_f1(tp: np.ndarray, predicted: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Macro-F1 from per-class counts (last axis), 0 for a class neither predicted nor present,
    as sklearn's f1_score(average="macro", zero_division=0)."""
    denominator = predicted + gold
    f1 = np.divide(2 * tp, denominator, out=np.zeros_like(denominator, dtype=np.float64),
                   where=denominator > 0)
    return f1.mean(-1)


def bootstrap(gold: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray, classes: int,
              resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, np.ndarray]:
    """B - A accuracy and macro-F1 on `resamples` paired resamples of the rows.

    Both figures depend on a resample only through how many rows it drew of each (gold, A's,
    B's prediction) triple, and a test split holds few distinct triples (at most classes^3: 8
    for a binary task). So each chunk of resamples draws row indices, counts the triples with
    one bincount, and one small matrix product turns the counts into per-class sums: right A,
    right B, then per class A's TP, A's predicted, B's TP, B's predicted, gold."""
    n, k = len(gold), classes
    triples, cell = np.unique(np.stack([gold, pred_a, pred_b], 1), axis=0, return_inverse=True)
    cell = cell.ravel()
    g, a, b = (np.eye(k)[triples[:, i]] for i in range(3))
    features = np.hstack([(triples[:, 1] == triples[:, 0])[:, None],
                          (triples[:, 2] == triples[:, 0])[:, None], a * g, a, b * g, b, g])
    u = len(triples)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(resamples, CELLS // max(n, 1)))
    sums = []
    for start in range(0, resamples, chunk):
        m = min(chunk, resamples - start)
        drawn = cell[rng.integers(0, n, size=(m, n), dtype=np.int32)] + u * np.arange(m)[:, None]
        counts = np.bincount(drawn.ravel(), minlength=m * u).reshape(m, u)
        sums.append(counts @ features)
    s = np.vstack(sums)
    tp_a, pr_a, tp_b, pr_b, gd = (s[:, 2 + i * k: 2 + (i + 1) * k] for i in range(5))
    return {"accuracy": (s[:, 1] - s[:, 0]) / n,
            "macro_f1": macro_f1(tp_b, pr_b, gd) - macro_f1(tp_a, pr_a, gd)}


def compare(a: Scored, b: Scored, resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Everything `compare` reports, JSON-ready: both runs' figures, B - A with its paired
    bootstrap 95% interval, the flips, McNemar's p and a one-line verdict."""
    row_ids, gold, pred_a, pred_b, labels = pair(a, b)
    k = len(labels)
    counts = {}
    for name, pred in (("a", pred_a), ("b", pred_b)):
        one = np.eye(k)[pred]
        gold_1 = np.eye(k)[gold]
        counts[name] = {"accuracy": float(np.mean(pred == gold)),
                        "macro_f1": float(macro_f1((one * gold_1).sum(0), one.sum(0),
                                                   gold_1.sum(0)))}
    diffs = bootstrap(gold, pred_a, pred_b, k, resamples, seed)
    figures = {}
    for metric in ("accuracy", "macro_f1"):
        low, high = np.percentile(diffs[metric], [2.5, 97.5])
        figures[metric] = {"a": counts["a"][metric], "b": counts["b"][metric],
                           "diff": counts["b"][metric] - counts["a"][metric],
                           "ci95": [float(low), float(high)]}
    flipped = flips(gold, pred_a, pred_b, row_ids)
    result = {"a": {"ref": a.ref, "source": a.source, "mlflow_run_id": a.run_id},
              "b": {"ref": b.ref, "source": b.source, "mlflow_run_id": b.run_id},
              "task": "single_label", "split": a.report.get("split") or b.report.get("split"),
              "rows": int(len(gold)), "classes": k,
              "bootstrap": {"resamples": resamples, "seed": seed, "level": 0.95},
              **figures, "flips": flipped,
              "mcnemar_p": mcnemar_p(flipped["right_to_wrong"], flipped["wrong_to_right"])}
    result["verdict_metric"] = HEADLINE
    result["verdict"] = verdict(figures[HEADLINE])
    return result


def verdict(figure: dict, metric: str = HEADLINE) -> str:
    """'B - A macro-F1 (the headline) +0.4 pt, 95% CI [-0.3, +1.1]: within noise' (or B is
    better / B is worse), on `metric`'s figures."""
    low, high = figure["ci95"]
    call = ("within noise" if low <= 0 <= high else "B is better" if low > 0 else "B is worse")
    return (f"B - A {named(metric)} {100 * figure['diff']:+.1f} pt, 95% CI "
            f"[{100 * low:+.1f}, {100 * high:+.1f}]: {call}")


def named(metric: str) -> str:
    """`macro-F1 (the headline)`: a figure's name in a verdict, the headline said as such."""
    return NAMES[metric] + (" (the headline)" if metric == HEADLINE else "")


def table(result: dict) -> str:
    """The console summary: sources, the figures with B - A and its interval, flips, verdict."""
    f, boot = result["flips"], result["bootstrap"]
    lines = [f"A: {result['a']['source']}", f"B: {result['b']['source']}",
             f"{result['split'] or 'same'} split, {result['rows']} rows matched by row_id; "
             f"paired bootstrap {boot['resamples']:,} resamples (seed {boot['seed']})", "",
             f"{'':10}{'A':>8}{'B':>8}{'B - A (pt)':>12}  95% CI (pt)"]
    for metric, name in (("accuracy", "accuracy"), ("macro_f1", "macro-F1")):
        m = result[metric]
        lines.append(f"{name:10}{m['a']:8.4f}{m['b']:8.4f}{points(m['diff']):>12}  "
                     f"[{points(m['ci95'][0])}, {points(m['ci95'][1])}]")
    lines += ["", f"flipped: right->wrong {f['right_to_wrong']}, wrong->right "
                  f"{f['wrong_to_right']} (both right {f['both_right']}, both wrong "
                  f"{f['both_wrong']}); McNemar exact p = {result['mcnemar_p']:.4g}"]
    for key, name in (("right_to_wrong_rows", "right->wrong"), ("wrong_to_right_rows",
                                                                "wrong->right")):
        if f[key]:
            lines.append(f"  {name} row ids: {', '.join(map(str, f[key]))}"
                         f"{', ...' if len(f[key]) < f[key.removesuffix('_rows')] else ''}")
    lines += ["", f"verdict: {result['verdict']}"]
    return "\n".join(lines)


def tracked(result: dict) -> dict[str, float]:
    """The comparison as MLflow metrics on run B (the latest comparison wins; each one's JSON is
    its own artifact), under `vs/`: the name sorts after eval/, train/ and val/, so a compared
    run's headline still comes first in the UI's alphabetical lists."""
    out = {}
    for metric in ("accuracy", "macro_f1"):
        m = result[metric]
        out.update({f"{VS}{metric}_diff": m["diff"], f"{VS}{metric}_diff_ci_low": m["ci95"][0],
                    f"{VS}{metric}_diff_ci_high": m["ci95"][1]})
    out.update({f"{VS}right_to_wrong": result["flips"]["right_to_wrong"],
                f"{VS}wrong_to_right": result["flips"]["wrong_to_right"],
                f"{VS}mcnemar_p": result["mcnemar_p"], f"{VS}rows": result["rows"]})
    return out


def points(share: float) -> str:
    """A difference of shares in percentage points, signed: 0.0123 -> '+1.23'."""
    return f"{100 * share:+.2f}"
