"""A trained model's outputs on a token file, in the file's row order, and as a table.

Batches are length-sorted for speed, then every prediction is scattered back to its row, so the
per-row output is in file order (HF Trainer's `predict()` with length grouping returns sampler
order, an easy way to report a correct model as chance-level).

Label text goes where it is data (gold and predicted values) as it is; where a name is required
(probability columns) its `wellfed.names.keys` key does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from wellfed import device as dev
from wellfed import tasks
from wellfed.data import shapes
from wellfed.data.batching import BatchSpec, collate, eval_batches
from wellfed.data.token_files import TokenFile
from wellfed.evaluate.scores import macro_f1_multi, tune_threshold
from wellfed.names import keys as label_keys


PREDICT_SHAPES = 16
"""On a GPU, prediction pads its batches to this many planned widths (data/shapes.py), as
training does: each new width costs new attention plans."""


def predict(model, data: TokenFile, pad_id: int, device: torch.device, precision,
            batch_rows: int = 64, batch_tokens: int = 8192,
            task: str = "single_label", logits: bool = False,
            desc: str = "predict") -> np.ndarray:
    """Every row's outputs (wellfed.tasks.outputs: class or label probabilities, regression
    values), or with `logits` the logits themselves, in file order. `desc` names the pass on
    its progress bar (`evaluate: test`), shown on a terminal only and gone when done."""
    model.eval().to(device)
    spec = BatchSpec(global_batch=batch_rows, micro_rows=batch_rows, micro_tokens=batch_tokens,
                     pad_multiple=dev.pad_multiple(0, device))
    if device.type == "cuda" and len(data):  # a few planned shapes, not one per width
        spec = shapes.plan(data.lengths, dataclasses.replace(spec, pad_multiple=1),
                           PREDICT_SHAPES)
    probs = np.zeros((len(data), model.config.num_labels), np.float32)
    with torch.no_grad():
        for idx in tqdm(eval_batches(data.lengths, spec, 0), desc=desc, unit="batch",
                        mininterval=1.0, leave=False, disable=None):
            host = collate(data, idx, pad_id, spec)
            batch = dev.to_device(host, device)
            with dev.autocast(device, precision):
                out = dev.forward(model, batch, host, keep_mask=bool(spec.widths))
            out = out[:len(idx)]  # a shape plan's filler rows come last
            probs[idx] = (out.float() if logits else tasks.outputs(task, out)).cpu().numpy()
    return probs


def load_exported(model_dir):
    """The exported model of `model_dir` (a Hugging Face model directory), quietly."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a local directory: no download to show, only noise
    return AutoModelForSequenceClassification.from_pretrained(model_dir)


def predict_exported(model, data: TokenFile, pad_id: int, task: str, desc: str,
                     logits: bool = False) -> np.ndarray:
    """Every row's outputs (or `logits`) of `model` on `data`, on the GPU when there is one;
    `desc` names the pass on its progress bar."""
    device = torch.device("cuda" if dev.cuda_available() else "cpu")
    return predict(model, data, pad_id, device, dev.choose_precision("auto", device), task=task,
                   logits=logits, desc=desc)


def from_training(path, data: TokenFile) -> np.ndarray | None:
    """The exported model's outputs on `data` (the validation split) as the train stage wrote them
    (train/outputs/export.py write_validation_outputs), or None when it wrote none or they are not
    these rows."""
    try:
        saved = np.load(path)
        outputs, row_ids = saved["outputs"], saved["row_ids"]
    except (OSError, KeyError, ValueError):
        return None
    if len(outputs) != len(data) or not np.array_equal(row_ids, data.row_ids):
        return None
    return outputs


def validation_logits(model_dir, data: TokenFile, pad_id: int, task: str):
    """The exported model in `model_dir` and its logits on `data` (the validation split), on the
    GPU when there is one: one pass for the threshold and the calibration both."""
    model = load_exported(model_dir)
    return model, predict_exported(model, data, pad_id, task, "export: validation", logits=True)


def threshold_on(gold: np.ndarray, probs: np.ndarray) -> tuple[float, float, float]:
    """Multi-label: (tuned threshold, its macro-F1, macro-F1 at 0.5) of the validation `probs`."""
    best, f1 = tune_threshold(gold, probs)
    return best, f1, macro_f1_multi(gold, probs >= 0.5)


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
