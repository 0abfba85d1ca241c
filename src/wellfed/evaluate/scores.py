"""The figures of an evaluation: accuracy, F1 and per-class scores, multi-label thresholds,
regression correlations, the confusion pairs, and calibration (ECE and its reliability table).

The counts behind accuracy and F1 are a few numpy lines, not scikit-learn: importing it costs the
evaluate stage ~0.7 s of its fixed cost here (tests/test_evaluation.py holds these figures to
scikit-learn's). scipy's correlations are imported where regression needs them.

Per-class figures are keyed by each label's `wellfed.names.keys` key (label text may hold any
character); the label's own text stays beside it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wellfed import tasks
from wellfed.names import keys as label_keys


def f1_parts(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> tuple[np.ndarray, ...]:
    """Precision, recall and F1 per class from its counts, 0 where a ratio is 0/0 (as
    scikit-learn with zero_division=0; tests/test_evaluation.py holds them to it)."""
    def ratio(num, den):
        return np.divide(num, den, out=np.zeros(len(num)), where=den > 0)

    return ratio(tp, tp + fp), ratio(tp, tp + fn), ratio(2 * tp, 2 * tp + fp + fn)


def per_class(names: list[str], precision, recall, f1, support) -> dict:
    return {key: {"label": str(name), "precision": float(p), "recall": float(r), "f1": float(f),
                  "support": int(s)}
            for key, name, p, r, f, s in zip(label_keys(names), names, precision, recall, f1,
                                              support)}


def score(gold: np.ndarray, probs: np.ndarray, names: list[str]) -> dict:
    """Accuracy, macro-F1 and per-class figures keyed by each label's safe key (the label's own
    text is its `label`), so that `per_class.<key>.f1` here is `eval/<key>/f1` in MLflow."""
    gold, pred, k = np.asarray(gold, np.int64), probs.argmax(1), len(names)
    counts = np.bincount(gold * k + pred, minlength=k * k).reshape(k, k)  # gold x predicted
    tp = np.diag(counts).astype(np.float64)
    support = counts.sum(1)
    precision, recall, f1 = f1_parts(tp, counts.sum(0) - tp, support - tp)
    return {"accuracy": float(np.mean(pred == gold)) if len(gold) else 0.0,
            "macro_f1": float(f1.mean()), "rows": int(len(gold)),
            "per_class": per_class(names, precision, recall, f1, support)}


def label_counts(gold: np.ndarray, pred: np.ndarray) -> tuple[np.ndarray, ...]:
    """Multi-label: true positives, false positives and false negatives per label."""
    gold, pred = gold.astype(bool), pred.astype(bool)
    return ((gold & pred).sum(0).astype(np.float64), (~gold & pred).sum(0).astype(np.float64),
            (gold & ~pred).sum(0).astype(np.float64))


def macro_f1_multi(gold: np.ndarray, pred: np.ndarray) -> float:
    return float(f1_parts(*label_counts(gold, pred))[2].mean())


def score_multi_label(gold: np.ndarray, probs: np.ndarray, names: list[str],
                      threshold: float) -> dict:
    """Micro/macro-F1, subset accuracy (every label of a row right) and per-label figures of
    0/1 `gold` against `probs` >= `threshold`."""
    pred, gold = probs >= threshold, gold.astype(int) > 0
    tp, fp, fn = label_counts(gold, pred)
    precision, recall, f1 = f1_parts(tp, fp, fn)
    micro = f1_parts(tp.sum(keepdims=True), fp.sum(keepdims=True), fn.sum(keepdims=True))[2]
    return {"threshold": float(threshold), "micro_f1": float(micro[0]),
            "macro_f1": float(f1.mean()),
            "subset_accuracy": float(np.mean((gold == pred).all(1))) if len(gold) else 0.0,
            "rows": int(len(gold)), "per_class": per_class(names, precision, recall, f1,
                                                            gold.sum(0))}


def score_regression(gold: np.ndarray, values: np.ndarray, names: list[str]) -> dict:
    """Pearson r, Spearman rho and MSE per target, and their means over targets."""
    from scipy.stats import pearsonr, spearmanr

    per = {}
    for i, (key, name) in enumerate(zip(label_keys(names), names)):
        g, v = gold[:, i].astype(np.float64), values[:, i].astype(np.float64)
        constant = g.std() == 0 or v.std() == 0  # r is undefined: say 0, not NaN
        per[key] = {"label": str(name),
                    "pearson": 0.0 if constant else float(pearsonr(g, v)[0]),
                    "spearman": 0.0 if constant else float(spearmanr(g, v)[0]),
                    "mse": float(np.mean((g - v) ** 2)), "gold_sd": float(g.std())}
    mean = {k: float(np.mean([t[k] for t in per.values()])) for k in ("pearson", "spearman", "mse")}
    return {**mean, "rows": int(len(gold)), "per_target": per}


HEADLINE = {"single_label": ("accuracy", "macro_f1", "ece"),
            "multi_label": ("micro_f1", "macro_f1", "subset_accuracy", "ece"),
            "regression": ("pearson", "spearman", "mse")}
"""Each task's figures in the DVC metrics file (eval/<name>); the rest are in the report."""


def score_task(task: str, gold: np.ndarray, outputs: np.ndarray, names: list[str],
               threshold: float = tasks.VAL_THRESHOLD) -> dict:
    if task == "multi_label":
        return score_multi_label(gold, outputs, names, threshold)
    if task == "regression":
        return score_regression(gold, outputs, names)
    return score(gold, outputs, names)


def tune_threshold(gold: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """Multi-label: the threshold in 0.05..0.95 with the best macro-F1 (ties: nearest 0.5)."""
    grid = np.round(np.arange(0.05, 0.951, 0.05), 2)
    scores = [macro_f1_multi(gold, probs >= t) for t in grid]
    best = max(range(len(grid)), key=lambda i: (round(scores[i], 12), -abs(grid[i] - 0.5)))
    return float(grid[best]), float(scores[best])


def confusion(pairs: pd.DataFrame, labels: list) -> np.ndarray:
    """Counts of `confusion_pairs`, gold in rows, predicted in columns, in `labels` order (a
    pair with a value outside `labels` is not counted)."""
    index = {label: i for i, label in enumerate(labels)}
    matrix = np.zeros((len(labels), len(labels)), np.int64)
    for gold, pred in zip(pairs["gold"], pairs["predicted"]):
        if gold in index and pred in index:
            matrix[index[gold], index[pred]] += 1
    return matrix


def confusion_pairs(frame: pd.DataFrame, task: str, names: list[str]) -> pd.DataFrame:
    """The (gold, predicted) pairs DVC's confusion template counts. Single-label: one per row;
    multi-label: one per label a row holds or was given, the other side `(none)` when it
    missed; regression: the first target's values rounded to 0.5 (bins, not classes)."""
    if task == "single_label":
        return frame[["gold", "predicted"]]
    if task == "regression":
        key = label_keys(names)[0]
        return pd.DataFrame({"gold": (frame[f"gold_{key}"] * 2).round() / 2,
                             "predicted": (frame[f"predicted_{key}"] * 2).round() / 2})
    pairs = []
    for gold, pred in zip(frame["gold"], frame["predicted"]):
        for label in sorted(set(gold) | set(pred), key=str):
            pairs.append((label if label in gold else "(none)",
                          label if label in pred else "(none)"))
    return pd.DataFrame(pairs, columns=["gold", "predicted"])


ECE_BINS = 15  # the usual choice (Guo et al. 2017); 872 SST-2 dev rows -> ~58 per bin if spread


def calibration(task: str, gold: np.ndarray, probs: np.ndarray, bins: int = ECE_BINS) -> dict:
    """Expected calibration error and its reliability table, or {} for regression.

    Single-label: each row's confidence is its top-class probability and its outcome is whether
    that class is the gold one. Multi-label: every (row, label) probability is pooled, its outcome
    the label's gold 0/1 (so the threshold plays no part). The confidences fall into `bins`
    equal-width bins on [0, 1]; a value on an edge goes to the lower bin and 0 to the first, as
    in `sklearn.calibration.calibration_curve(strategy="uniform")`. ECE = sum over bins of
    (rows in bin / all rows) x |accuracy in bin - mean confidence in bin|: 0 when a score of 0.8
    is right 80% of the time, 0.2 for a model always 100% sure and right 80% of the time."""
    if task == "regression":
        return {}
    probs = np.clip(np.asarray(probs, np.float64), 0.0, 1.0)  # float32 softmax can top 1.0
    if task == "single_label":
        confidence = probs.max(1)
        correct = (probs.argmax(1) == np.asarray(gold)).astype(np.float64)
    else:
        confidence = probs.ravel()
        correct = (np.asarray(gold).ravel() > 0.5).astype(np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    ids = np.searchsorted(edges[1:-1], confidence)
    count = np.bincount(ids, minlength=bins)
    hits = np.bincount(ids, weights=correct, minlength=bins)
    mass = np.bincount(ids, weights=confidence, minlength=bins)
    seen = count > 0
    accuracy = np.divide(hits, count, out=np.zeros(bins), where=seen)
    mean_conf = np.divide(mass, count, out=np.zeros(bins), where=seen)
    ece = float(np.sum(count / max(len(confidence), 1) * np.abs(accuracy - mean_conf)))
    # Empty bins are null in the table, not 0: a plot or reader must not mistake them for data.
    return {"ece": ece, "calibration": {
        "bins": bins, "confidence": "top-class probability" if task == "single_label"
        else "each label's probability, pooled",
        "edges": edges.tolist(), "count": count.tolist(),
        "accuracy": [float(a) if s else None for a, s in zip(accuracy, seen)],
        "mean_confidence": [float(c) if s else None for c, s in zip(mean_conf, seen)]}}


def headline_line(metrics: dict, task: str, split: str, threshold: float) -> str:
    """'evaluate on test (300 rows): accuracy 0.9467, macro F1 0.9468, ECE 0.0126 (ECE 0.0168
    before calibration)'."""
    words = {"macro_f1": "macro F1", "micro_f1": "micro F1", "ece": "ECE"}
    shown = ", ".join(f"{words.get(k, k.replace('_', ' '))} {metrics[k]:.4f}"
                      for k in HEADLINE[task])
    at = f" at threshold {threshold:g}" if task == "multi_label" else ""
    before = (f" (ECE {metrics['ece_uncalibrated']:.4f} before calibration)"
              if "ece_uncalibrated" in metrics else "")
    return f"evaluate on {split} ({metrics['rows']} rows): {shown}{at}{before}"
