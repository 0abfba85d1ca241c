"""The three task shapes: what the loss is, what validation measures, which figure heads it.

- single_label: one class per row; softmax cross-entropy; accuracy and macro-F1.
- multi_label: any number of classes per row (a 0/1 vector); sigmoid + binary cross-entropy per
  label, averaged over labels; micro/macro-F1 and subset accuracy at a threshold.
- regression: one or more real targets per row; mean squared error; Pearson r per target.

Sentence pairs are not a task of their own: any of the three can take one text or a pair.
Validation runs on every rank over its share of the rows, so each task sums *sufficient
statistics* (per-class true/false positives, sums of products) that one all-reduce combines
into exact figures, not a mean of per-rank F1s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

TASKS = ("single_label", "multi_label", "regression")
PROBLEM_TYPE = {"single_label": "single_label_classification",
                "multi_label": "multi_label_classification", "regression": "regression"}
"""The name Hugging Face configs give each task (`config.problem_type`)."""
HEADLINE = {"single_label": "val/macro_f1", "multi_label": "val/macro_f1",
            "regression": "val/pearson"}
"""The validation figure that says how good a model is, for the console and run summary."""
VAL_THRESHOLD = 0.5  # multi-label figures during training; the tuned one comes at export


def loss_weights(task: str, class_weights, labels: np.ndarray, names: list[str]):
    """Per-class loss weights from `train.class_weights` and train's labels, or None.

    single_label: class c weighs n / (K x count_c) ("balanced": the mean row weight stays 1, so
    the loss scale and learning rate mean the same as unweighted). multi_label: each label's
    positive examples weigh negatives / positives (BCE's `pos_weight`)."""
    if class_weights == "none":
        return None
    if task == "regression":
        raise ValueError("train.class_weights applies to classification; a regression task "
                         "takes none")
    k = len(names)
    if task == "single_label":
        counts = np.bincount(labels, minlength=k).astype(np.float64)
        balanced = len(labels) / (k * np.maximum(counts, 1))
    else:
        positives = labels.sum(0).astype(np.float64)
        balanced = (len(labels) - positives) / np.maximum(positives, 1)
    if class_weights == "balanced":
        return torch.tensor(balanced, dtype=torch.float32)
    unknown = sorted(set(map(str, class_weights)) - set(names))
    if unknown:
        raise ValueError(f"train.class_weights names {unknown[0]!r}, which is not a label "
                         f"(labels: {', '.join(map(repr, names[:10]))}); fix the name")
    given = {str(k): float(v) for k, v in class_weights.items()}
    return torch.tensor([given.get(n, 1.0) for n in names], dtype=torch.float32)


def row_loss(task: str, logits: torch.Tensor, labels: torch.Tensor,
             weights: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's loss (float32), to be weighted and normalised by the caller."""
    logits = logits.float()
    if task == "single_label":
        return F.cross_entropy(logits, labels, weight=weights, reduction="none")
    if task == "multi_label":
        return F.binary_cross_entropy_with_logits(logits, labels, pos_weight=weights,
                                                  reduction="none").mean(-1)
    return F.mse_loss(logits, labels, reduction="none").mean(-1)


def val_stats(task: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A float64 vector of sums for one batch; add them up over batches and ranks."""
    logits = logits.float()
    loss = row_loss(task, logits, labels).sum()
    rows = torch.full((), float(len(logits)), device=logits.device)
    if task == "regression":
        x, y = logits.double(), labels.double()
        sums = torch.stack([x.sum(0), y.sum(0), (x * x).sum(0), (y * y).sum(0), (x * y).sum(0)])
        return torch.cat([torch.stack([loss.double(), rows.double()]), sums.flatten()])
    k = logits.shape[-1]
    if task == "single_label":
        pred = F.one_hot(logits.argmax(-1), k).double()
        gold = F.one_hot(labels, k).double()
    else:
        pred = (torch.sigmoid(logits) >= VAL_THRESHOLD).double()
        gold = labels.double()
    tp = (pred * gold).sum(0)
    exact = (pred == gold).all(-1).sum().double()
    return torch.cat([torch.stack([loss.double(), rows.double(), exact]),
                      tp, pred.sum(0) - tp, gold.sum(0) - tp])


def val_metrics(task: str, totals: list[float], k: int) -> dict[str, float]:
    """Figures from summed `val_stats` (k classes or targets)."""
    t = np.asarray(totals, np.float64)
    loss, rows = t[0], max(t[1], 1.0)
    out = {"val/loss": loss / rows}
    if task == "regression":
        sx, sy, sxx, syy, sxy = t[2:].reshape(5, k)
        cov = sxy / rows - sx * sy / rows ** 2
        var_x = np.maximum(sxx / rows - (sx / rows) ** 2, 0)
        var_y = np.maximum(syy / rows - (sy / rows) ** 2, 0)
        r = np.where(var_x * var_y > 0, cov / np.sqrt(var_x * var_y + 1e-300), 0.0)
        out.update({"val/pearson": float(r.mean()), "val/mse": loss / rows})
        return out
    exact = t[2]
    tp, fp, fn = t[3:].reshape(3, k)
    denominator = 2 * tp + fp + fn
    f1 = np.divide(2 * tp, denominator, out=np.zeros(k), where=denominator > 0)
    out["val/macro_f1"] = float(f1.mean())
    if task == "single_label":
        out["val/accuracy"] = exact / rows
    else:
        total = 2 * tp.sum() + fp.sum() + fn.sum()
        out["val/micro_f1"] = float(2 * tp.sum() / total) if total else 0.0
        out["val/subset_accuracy"] = exact / rows
    return out


def outputs(task: str, logits: torch.Tensor) -> torch.Tensor:
    """What a row's prediction is made of: class probabilities (softmax), per-label
    probabilities (sigmoid), or the regression values themselves."""
    logits = logits.float()
    if task == "single_label":
        return torch.softmax(logits, -1)
    if task == "multi_label":
        return torch.sigmoid(logits)
    return logits


MODEL_INFO = "wellfed.json"
"""Beside config.json in an exported model: the task, the text column(s) the model reads, the
multi-label threshold and max_length, so that whoever loads the folder predicts as evaluation did;
and the calibration record (wellfed/evaluate/temperature.py: the temperatures are in the weights)."""


def write_model_info(model_dir: Path, info: dict) -> None:
    from wellfed.outputs import write_json

    write_json(Path(model_dir) / MODEL_INFO, info)
