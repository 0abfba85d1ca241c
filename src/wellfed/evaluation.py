"""Scoring a trained model on a token file: predictions in the original row order, metrics, plots.

Batches are length-sorted for speed, then every prediction is scattered back to its row, so the
per-row output is in file order (HF Trainer's `predict()` with length grouping returns sampler
order, an easy way to report a correct model as chance-level).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import (accuracy_score, confusion_matrix, f1_score,
                             precision_recall_fscore_support)
from tqdm import tqdm

from wellfed import device as dev
from wellfed.data.batching import BatchSpec, eval_batches
from wellfed.data.shards import TokenFile


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
    pred = probs.argmax(1)
    ids = list(range(len(names)))
    precision, recall, f1, support = precision_recall_fscore_support(
        gold, pred, labels=ids, zero_division=0)
    return {"accuracy": float(accuracy_score(gold, pred)),
            "macro_f1": float(f1_score(gold, pred, labels=ids, average="macro", zero_division=0)),
            "rows": int(len(gold)),
            "per_class": {name: {"precision": float(p), "recall": float(r), "f1": float(f),
                                 "support": int(s)}
                          for name, p, r, f, s in zip(names, precision, recall, f1, support)}}


def predictions_frame(data: TokenFile, probs: np.ndarray, names: list[str]) -> pd.DataFrame:
    pred = probs.argmax(1)
    frame = pd.DataFrame({"row_id": data.row_ids, "gold": np.asarray(names, object)[data.labels],
                          "predicted": np.asarray(names, object)[pred]})
    for i, name in enumerate(names):
        frame[f"prob_{name}"] = probs[:, i]
    return frame


def confusion(gold: np.ndarray, probs: np.ndarray, names: list[str]) -> np.ndarray:
    return confusion_matrix(gold, probs.argmax(1), labels=list(range(len(names))))


def plot_confusion(matrix: np.ndarray, names: list[str], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay

    fig, ax = plt.subplots(figsize=(2 + 0.6 * len(names), 1.6 + 0.6 * len(names)), dpi=120)
    ConfusionMatrixDisplay(matrix, display_labels=names).plot(ax=ax, colorbar=False, cmap="Blues")
    ax.set_title("confusion matrix")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
