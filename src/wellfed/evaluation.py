"""Scoring a trained model on a token file: predictions in the original row order, metrics, plots.

Batches are length-sorted for speed, then every prediction is scattered back to its row, so the
per-row output is in file order (HF Trainer's `predict()` with length grouping returns sampler
order, an easy way to report a correct model as chance-level).

scikit-learn (~0.9 s to import here) is imported by the functions that use it: the train stage
imports this module to calibrate.

Label text goes where it is data (gold/predicted values, plot tick labels, the per-class `label`)
as it is; where a name is required (per-class metric keys, probability columns) its
`wellfed.names.keys` key does.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from wellfed import device as dev
from wellfed import tasks
from wellfed.data import shapes
from wellfed.data.batching import BatchSpec, collate, eval_batches
from wellfed.data.token_files import TokenFile
from wellfed.names import keys as label_keys

log = logging.getLogger(__name__)

PREDICT_SHAPES = 16
"""On a GPU, prediction pads its batches to this many planned widths (data/shapes.py), as
training does: each new width costs new attention plans."""


def predict(model, data: TokenFile, pad_id: int, device: torch.device, precision,
            batch_rows: int = 64, batch_tokens: int = 8192,
            task: str = "single_label", logits: bool = False) -> np.ndarray:
    """Every row's outputs (wellfed.tasks.outputs: class or label probabilities, regression
    values), or with `logits` the logits themselves, in file order."""
    model.eval().to(device)
    spec = BatchSpec(global_batch=batch_rows, micro_rows=batch_rows, micro_tokens=batch_tokens,
                     pad_multiple=dev.pad_multiple(0, device))
    if device.type == "cuda" and len(data):  # a few planned shapes, not one per width
        spec = shapes.plan(data.lengths, dataclasses.replace(spec, pad_multiple=1),
                           PREDICT_SHAPES)
    probs = np.zeros((len(data), model.config.num_labels), np.float32)
    with torch.no_grad():
        for idx in tqdm(eval_batches(data.lengths, spec, 0), desc="predict", unit="batch",
                        mininterval=1.0, leave=False):
            host = collate(data, idx, pad_id, spec)
            batch = dev.to_device(host, device)
            with dev.autocast(device, precision):
                out = dev.forward(model, batch, host, keep_mask=bool(spec.widths))
            out = out[:len(idx)]  # a shape plan's filler rows come last
            probs[idx] = (out.float() if logits else tasks.outputs(task, out)).cpu().numpy()
    return probs


def score(gold: np.ndarray, probs: np.ndarray, names: list[str]) -> dict:
    """Accuracy, macro-F1 and per-class figures keyed by each label's safe key (the label's own
    text is its `label`), so that `per_class.<key>.f1` here is `eval/<key>/f1` in MLflow."""
    from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support

    pred = probs.argmax(1)
    ids = list(range(len(names)))
    precision, recall, f1, support = precision_recall_fscore_support(
        gold, pred, labels=ids, zero_division=0)
    return {"accuracy": float(accuracy_score(gold, pred)),
            "macro_f1": float(f1_score(gold, pred, labels=ids, average="macro", zero_division=0)),
            "rows": int(len(gold)),
            "per_class": {key: {"label": str(name), "precision": float(p), "recall": float(r),
                                "f1": float(f), "support": int(s)}
                          for key, name, p, r, f, s in zip(label_keys(names), names, precision,
                                                           recall, f1, support)}}


def score_multi_label(gold: np.ndarray, probs: np.ndarray, names: list[str],
                      threshold: float) -> dict:
    """Micro/macro-F1, subset accuracy (every label of a row right) and per-label figures of
    0/1 `gold` against `probs` >= `threshold`."""
    from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support

    pred = (probs >= threshold).astype(int)
    gold = gold.astype(int)
    precision, recall, f1, support = precision_recall_fscore_support(gold, pred, zero_division=0)
    return {"threshold": float(threshold),
            "micro_f1": float(f1_score(gold, pred, average="micro", zero_division=0)),
            "macro_f1": float(f1_score(gold, pred, average="macro", zero_division=0)),
            "subset_accuracy": float(accuracy_score(gold, pred)),
            "rows": int(len(gold)),
            "per_class": {key: {"label": str(name), "precision": float(p), "recall": float(r),
                                "f1": float(f), "support": int(s)}
                          for key, name, p, r, f, s in zip(label_keys(names), names, precision,
                                                           recall, f1, support)}}


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
    from sklearn.metrics import f1_score

    grid = np.round(np.arange(0.05, 0.951, 0.05), 2)
    gold = gold.astype(int)
    scores = [f1_score(gold, (probs >= t).astype(int), average="macro", zero_division=0)
              for t in grid]
    best = max(range(len(grid)), key=lambda i: (round(scores[i], 12), -abs(grid[i] - 0.5)))
    return float(grid[best]), float(scores[best])


def predictions_frame(data: TokenFile, probs: np.ndarray, names: list[str],
                      task: str = "single_label", threshold: float = 0.5) -> pd.DataFrame:
    """Row id and gold and predicted values. Single-label: label text and one `prob_<key>`
    column per class; multi-label: the lists of label texts and `prob_<key>`; regression:
    `gold_<key>` and `predicted_<key>` per target."""
    keys = label_keys(names)
    frame = pd.DataFrame({"row_id": data.row_ids})
    if task == "regression":
        for i, key in enumerate(keys):
            frame[f"gold_{key}"] = data.labels[:, i]
            frame[f"predicted_{key}"] = probs[:, i]
        return frame
    named = np.asarray(names, object)
    if task == "multi_label":
        frame["gold"] = [list(named[row > 0.5]) for row in data.labels]
        frame["predicted"] = [list(named[row >= threshold]) for row in probs]
    else:
        frame["gold"] = named[data.labels]
        frame["predicted"] = named[probs.argmax(1)]
    for i, key in enumerate(keys):
        frame[f"prob_{key}"] = probs[:, i]
    return frame


def confusion(pairs: pd.DataFrame, labels: list) -> np.ndarray:
    """Counts of `confusion_pairs`, gold in rows, predicted in columns, in `labels` order."""
    from sklearn.metrics import confusion_matrix

    return confusion_matrix(pairs["gold"], pairs["predicted"], labels=labels)


def plot_confusion(matrix: np.ndarray, names: list[str], path) -> None:
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay

    labels = [tick_label(n) for n in names]
    # Label text as it is: no mathtext, or `$5-$10` renders as math and `$\x$` stops the stage.
    with matplotlib.rc_context({"text.parse_math": False}), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, ax = plt.subplots(figsize=(2 + 0.6 * len(names), 1.6 + 0.6 * len(names)), dpi=120)
        ConfusionMatrixDisplay(matrix, display_labels=labels).plot(
            ax=ax, colorbar=False, cmap="Blues",  # a 0.6-inch column holds ~7 characters
            xticks_rotation="vertical" if max(map(len, labels)) > 7 else "horizontal")
        ax.set_title("confusion matrix")
        fig.savefig(path, format="png", bbox_inches="tight")  # long labels widen the image
        plt.close(fig)
    missing = {str(w.message) for w in caught if "missing from font" in str(w.message)}
    if missing:  # matplotlib warns once per character per draw: say it once
        log.warning("%s: %d label character(s) have no glyph in matplotlib's font and show as boxes "
                    "(labels.json and predictions.parquet hold the text)", path, len(missing))
    for w in caught:
        if str(w.message) not in missing:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def tick_label(name, chars: int = 30) -> str:
    """A label as a tick: its own text, cut to `chars` characters (the full text is in the data)."""
    text = str(name)
    return text if len(text) <= chars else text[:chars - 1] + "…"


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


def plot_scatter(gold: np.ndarray, values: np.ndarray, names: list[str], path) -> None:
    """Regression: predicted against gold per target, with the diagonal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"text.parse_math": False}):
        fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 4), dpi=110,
                                 squeeze=False)
        for ax, g, v, name in zip(axes[0], gold.T, values.T, names):
            ax.scatter(g, v, s=4, alpha=0.4)
            low, high = float(min(g.min(), v.min())), float(max(g.max(), v.max()))
            ax.plot([low, high], [low, high], color="grey", lw=1)
            ax.set_xlabel(f"gold {tick_label(name)}")
            ax.set_ylabel("predicted")
        fig.suptitle("predicted vs gold")
        fig.savefig(path, format="png", bbox_inches="tight")
        plt.close(fig)


def threshold_on(model_dir, data: TokenFile, pad_id: int) -> tuple[float, float, float]:
    """Multi-label: (tuned threshold, its macro-F1, macro-F1 at 0.5) of the model in
    `model_dir` on `data` (the validation split), on the GPU when there is one."""
    from sklearn.metrics import f1_score
    from transformers import AutoModelForSequenceClassification

    device = torch.device("cuda" if dev.cuda_available() else "cpu")
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    probs = predict(model, data, pad_id, device, dev.choose_precision("auto", device),
                    task="multi_label")
    best, f1 = tune_threshold(data.labels, probs)
    half = f1_score(data.labels.astype(int), (probs >= 0.5).astype(int), average="macro",
                    zero_division=0)
    return best, f1, float(half)


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


def plot_reliability(table: dict, ece: float, path) -> None:
    """Accuracy against confidence per bin with the diagonal (perfect calibration) above, the
    rows per bin as a histogram below: bars under the diagonal are overconfident bins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = np.asarray(table["edges"])
    width, left = np.diff(edges), edges[:-1]
    seen = [a is not None for a in table["accuracy"]]
    accuracy = np.array([a if a is not None else 0.0 for a in table["accuracy"]])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 6), dpi=110, sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.bar(left[seen], accuracy[seen], width=width[seen], align="edge", edgecolor="black",
            color="tab:blue", alpha=0.8, label="accuracy in bin")
    top.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="perfectly calibrated")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_ylabel("accuracy" if "top-class" in table["confidence"] else "share positive")
    top.set_title(f"reliability ({table['bins']} bins): ECE {ece:.4f}")
    top.legend(loc="upper left")
    bottom.bar(left, table["count"], width=width, align="edge", edgecolor="black", color="grey")
    bottom.set_ylabel("rows" if "top-class" in table["confidence"] else "row x label")
    bottom.set_xlabel(f"confidence ({table['confidence']})")
    fig.savefig(path, format="png", bbox_inches="tight")
    plt.close(fig)


def plot_residuals(gold: np.ndarray, values: np.ndarray, names: list[str], path) -> None:
    """Regression's stand-in for the reliability plot (it has no probabilities to calibrate):
    the residuals, predicted - gold, per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"text.parse_math": False}):
        fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.2), dpi=110,
                                 squeeze=False)
        for ax, g, v, name in zip(axes[0], gold.T, values.T, names):
            ax.hist(v - g, bins=40)
            ax.axvline(0, color="grey", lw=1)
            ax.set_xlabel(f"predicted - gold ({tick_label(name)})")
        fig.suptitle("residuals (regression: no probabilities to calibrate)")
        fig.savefig(path, format="png", bbox_inches="tight")
        plt.close(fig)
