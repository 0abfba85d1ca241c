"""The evaluate stage's files beside its metrics: every row's prediction, the confusion pairs
DVC's confusion plot counts, and the two pictures (confusion matrix or scatter; reliability
diagram or residuals). Each file is written whole or not at all (outputs.atomic_path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wellfed.data.token_files import TokenFile
from wellfed.evaluate import plots, scores
from wellfed.evaluate.predictions import predictions_frame
from wellfed.outputs import atomic_path


def write(out: Path, data: TokenFile, outputs: np.ndarray, names: list[str], task: str,
          threshold: float, metrics: dict) -> dict:
    """predictions.parquet, confusion.csv, confusion.png and reliability.png under `out`, from
    the split's `outputs` and its `metrics` (calibration's table); returns what the report adds
    (the confusion matrix, single- and multi-label)."""
    added = {}
    frame = predictions_frame(data, outputs, names, task, threshold)
    with atomic_path(out / "predictions.parquet") as tmp:
        frame.to_parquet(tmp, index=False)
    pairs = scores.confusion_pairs(frame, task, names)
    with atomic_path(out / "confusion.csv") as tmp:
        pairs.to_csv(tmp, index=False)
    with atomic_path(out / "confusion.png") as tmp:
        if task == "regression":
            plots.plot_scatter(data.labels, outputs, names, tmp)
        else:
            shown = names + ["(none)"] if task == "multi_label" else names
            matrix = scores.confusion(pairs, shown)
            added["confusion_matrix"] = matrix.tolist()
            plots.plot_confusion(matrix, shown, tmp)
    with atomic_path(out / "reliability.png") as tmp:  # can the scores be read as probabilities?
        if "calibration" in metrics:
            plots.plot_reliability(metrics["calibration"], metrics["ece"], tmp)
        else:
            plots.plot_residuals(data.labels, outputs, names, tmp)
    return added
