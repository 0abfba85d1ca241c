"""Scoring a trained model on a token file: predictions in the original row order, metrics, plots.

Batches are length-sorted for speed, then every prediction is scattered back to its row, so the
per-row output is in file order (HF Trainer's `predict()` with length grouping returns sampler
order, an easy way to report a correct model as chance-level).

Label text goes where it is data (gold/predicted values, plot tick labels, the per-class `label`)
as it is; where a name is required (per-class metric keys, probability columns) its
`wellfed.names.keys` key does.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import (accuracy_score, confusion_matrix, f1_score,
                             precision_recall_fscore_support)
from tqdm import tqdm

from wellfed import device as dev
from wellfed.data.batching import BatchSpec, eval_batches
from wellfed.data.shards import TokenFile
from wellfed.names import keys as label_keys

log = logging.getLogger(__name__)


def predict(model, data: TokenFile, pad_id: int, device: torch.device, precision,
            batch_rows: int = 64, batch_tokens: int = 8192) -> np.ndarray:
    """Class probabilities for every row of `data`, in file order."""
    model.eval().to(device)
    spec = BatchSpec(global_batch=1, micro_rows=batch_rows, micro_tokens=batch_tokens,
                     pad_multiple=dev.pad_multiple(0, device))
    probs = np.zeros((len(data), model.config.num_labels), np.float32)
    with torch.no_grad():
        for idx in tqdm(eval_batches(data.lengths, spec, 0), desc="predict", unit="batch",
                        mininterval=1.0, leave=False):
            host = data.gather(idx, pad_id, spec.pad_multiple)
            batch = dev.to_device(host, device)
            with dev.autocast(device, precision):
                logits = dev.forward(model, batch, host)
            probs[idx] = torch.softmax(logits.float(), -1).cpu().numpy()
    return probs


def score(gold: np.ndarray, probs: np.ndarray, names: list[str]) -> dict:
    """Accuracy, macro-F1 and per-class figures keyed by each label's safe key (the label's own
    text is its `label`), so that `per_class.<key>.f1` here is `eval/<key>/f1` in MLflow."""
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


def tracked(metrics: dict) -> dict[str, float]:
    """`score`'s figures under their MLflow keys: eval/accuracy, eval/<key>/precision, ..."""
    flat = {"eval/accuracy": metrics["accuracy"], "eval/macro_f1": metrics["macro_f1"]}
    for key, scores in metrics["per_class"].items():
        flat.update({f"eval/{key}/{k}": scores[k] for k in ("precision", "recall", "f1")})
    return flat


def predictions_frame(data: TokenFile, probs: np.ndarray, names: list[str]) -> pd.DataFrame:
    """Row id, gold and predicted label text, and one `prob_<key>` column per class."""
    pred = probs.argmax(1)
    frame = pd.DataFrame({"row_id": data.row_ids, "gold": np.asarray(names, object)[data.labels],
                          "predicted": np.asarray(names, object)[pred]})
    for i, key in enumerate(label_keys(names)):
        frame[f"prob_{key}"] = probs[:, i]
    return frame


def confusion(gold: np.ndarray, probs: np.ndarray, names: list[str]) -> np.ndarray:
    return confusion_matrix(gold, probs.argmax(1), labels=list(range(len(names))))


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
