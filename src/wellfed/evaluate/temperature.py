"""Temperature scaling: scores that can be read as probabilities, fitted after training.

A fine-tuned classifier is usually over-confident: Banking77 (77 intents, 4 epochs) reached test
accuracy 0.894 with an expected calibration error (ECE) of 0.293, so a user thresholding on the
served `score` was misled by ~30 points. Temperature scaling (Guo et al. 2017) divides the
logits by one number T, fitted on the validation split by the smallest negative log-likelihood:
T > 1 softens over-confident scores, and as every logit of a row is divided alike, no row's
arg-max changes. Multi-label decides by a threshold t: one shared T keeps every decision when t
moves with it (sigmoid(z / T) >= sigmoid(logit(t) / T) exactly when sigmoid(z) >= t), so the
exported threshold is the translated one. One temperature per label (its own binary
cross-entropy; a label with under MIN_POSITIVES validation positives takes the shared one) keeps
the decisions only at t = 0.5, where every label's boundary is z = 0: it is tried there and kept
when it gives the lower validation ECE. (Per-label temperatures under a threshold tuned after
them made a different decision rule: on GoEmotions' test split, macro-F1 fell from 0.20 to 0.15.)
Regression has no probabilities: not applicable.

The temperatures are folded into the layer that makes the logits (its weight rows and bias
divided by T, checked on validation rows), so the exported model's own outputs are calibrated:
evaluate, predict, the served MLflow model and `transformers.pipeline()` all read them from the
weights, and none can apply T twice or forget it. `wellfed.json` records them and the ECE before
and after (`calibration`); `uncalibrated` undoes them for a before/after figure.

Vector scaling (a scale and an offset per label) is not offered: its offset moves multi-label
decisions at a fixed threshold, and a head without a bias (GPT-2's and Llama's `score`) cannot
hold it.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wellfed import device as dev
from wellfed import tasks

BOUNDS = (0.05, 20.0)
"""Temperatures are kept in this range: a fit at its edge is no calibration. T runs to 0 when
sharper scores lower the validation loss without end: every row is right, or (a barely trained
model) the logits are nearly flat while the arg-max is mostly right; to infinity when flatter
scores always help: the scores say nothing of the labels (untrained, or labels unrelated to the
texts). `decide` says which, from the fit's own figures."""
DETAIL = "calibration"
"""The run details' line (track/run_details.py): the temperature, whether it is in the exported
model, the validation ECE before -> after (the evaluate stage adds the test split's:
eval_tracking.calibration)."""
MIN_POSITIVES = 10
"""Multi-label: a label with fewer validation positives than this takes the shared temperature
(with none, its own fit would drive every score of the label to 0)."""
PROBE_ROWS = 16  # validation rows that check the folded head against logits / T
WEIGHTS = re.compile(r"(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?")


@dataclass(frozen=True)
class Fit:
    """Temperatures fitted on validation logits, and what they do there."""

    temperatures: np.ndarray
    """One (single-label, or shared by every label) or one per label."""
    ece_before: float
    ece_after: float
    changed: int
    """Predictions that change: rows whose arg-max moves (single-label), or row x label
    decisions that cross the threshold (multi-label, at `threshold` after)."""
    threshold: float = 0.5
    """Multi-label: the threshold on the calibrated scores that makes the uncalibrated
    threshold's decisions (the same one at 0.5)."""
    right: float = float("nan")
    """The share of validation rows whose arg-max is their label (multi-label: of row x label
    decisions at the threshold), before calibration."""
    spread: float = float("nan")
    """The median over validation rows of the largest minus the smallest logit (multi-label:
    of |logit|): how far from flat the uncalibrated scores are."""
    classes: int = 0


@dataclass(frozen=True)
class Calibrated:
    """What `calibrate_model` did: the `wellfed.json` record, the run details' line, the
    console's line."""

    record: dict
    details: dict
    """{DETAIL: line} (empty for regression or `none`): read, not plotted, so not metrics (a
    run keeps ~30 metric keys; eval/ece is the served scores' figure)."""
    line: str
    threshold: float = 0.5
    """Multi-label: the decision threshold of the exported scores (Fit.threshold when applied)."""


def probabilities(task: str, logits: np.ndarray, temperatures=1.0) -> np.ndarray:
    """The model's outputs for `logits` divided by `temperatures` (tasks.outputs, as served)."""
    scaled = torch.as_tensor(np.asarray(logits, np.float64) / np.asarray(temperatures))
    return tasks.outputs(task, scaled).double().numpy()


def nll_fit(task: str, logits: np.ndarray, gold: np.ndarray, width: int) -> np.ndarray:
    """Temperatures (`width` of them) with the smallest validation NLL. The loss is convex in
    1/T, fitted as log(1/T) by L-BFGS; multi-label sums the labels' mean BCEs, so each label's
    temperature is fitted on its own column."""
    z = torch.as_tensor(logits, dtype=torch.float64)
    y = torch.as_tensor(np.array(gold))  # a copy: a memory-mapped token file is read-only
    log_beta = torch.zeros(width, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_beta], lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        scaled = z * log_beta.exp()
        value = (F.cross_entropy(scaled, y) if task == "single_label" else
                 F.binary_cross_entropy_with_logits(scaled, y.double(), reduction="none")
                 .mean(0).sum())
        value.backward()
        return value

    opt.step(loss)
    return np.clip(1.0 / log_beta.detach().exp().numpy(), *BOUNDS)


def moved(threshold: float, temperature: float) -> float:
    """The threshold on sigmoid(z / T) that makes the decisions `threshold` made on sigmoid(z)."""
    if threshold in (0.0, 0.5, 1.0):
        return threshold
    return float(1.0 / (1.0 + np.exp(-np.log(threshold / (1.0 - threshold)) / temperature)))


def fit(task: str, logits: np.ndarray, gold: np.ndarray, threshold: float = 0.5) -> Fit:
    """Temperatures for a single- or multi-label model's validation `logits` and `gold` labels
    (class ids, or 0/1 rows); `threshold`: the multi-label decision threshold on the
    uncalibrated scores."""
    from wellfed.evaluate.scores import calibration  # its ECE: the figure evaluate reports

    def ece(temperatures) -> float:
        return calibration(task, gold, probabilities(task, logits, temperatures))["ece"]

    shared = nll_fit(task, logits, gold, 1)
    before = probabilities(task, logits)
    logits, classes = np.asarray(logits, np.float64), logits.shape[1]
    if task == "single_label":
        changed = int((before.argmax(1) != probabilities(task, logits, shared).argmax(1)).sum())
        return Fit(shared, ece(1.0), ece(shared), changed,
                   right=float((before.argmax(1) == np.asarray(gold)).mean()),
                   spread=float(np.median(logits.max(1) - logits.min(1))), classes=classes)
    facts = {"right": float(((before >= threshold) == (np.asarray(gold) > 0.5)).mean()),
             "spread": float(np.median(np.abs(logits))), "classes": classes}

    def crossed(temperatures, at: float) -> int:
        return int(((before >= threshold) != (probabilities(task, logits, temperatures) >= at))
                   .sum())

    temperatures, after_threshold = shared, moved(threshold, float(shared[0]))
    own = nll_fit(task, logits, gold, logits.shape[1])
    own = np.where(np.asarray(gold).sum(0) >= MIN_POSITIVES, own, shared)
    if not crossed(own, threshold) and ece(own) < ece(shared):  # in practice: t = 0.5
        temperatures, after_threshold = own, threshold
    return Fit(temperatures, ece(1.0), ece(temperatures), crossed(temperatures, after_threshold),
               after_threshold, **facts)


def decide(mode: str, fitted: Fit) -> tuple[bool, str]:
    """Whether to apply the fit under train.calibrate, and why, in words."""
    if mode == "temperature":
        return True, "train.calibrate: temperature"
    if len(fitted.temperatures) == 1 and float(fitted.temperatures[0]) in BOUNDS:
        return False, f"{at_bound(fitted)} (train.calibrate: auto)"
    if fitted.changed:
        return False, (f"it would change {fitted.changed} prediction(s) (train.calibrate: auto "
                       "applies it only when none changes)")
    if fitted.ece_after < fitted.ece_before:
        return True, "train.calibrate: auto, it lowers validation ECE and changes no prediction"
    return False, "train.calibrate: auto applies it only when it lowers validation ECE"


def at_bound(fitted: Fit) -> str:
    """What a fit that ran to one of BOUNDS says about the model, from its own figures."""
    t = float(fitted.temperatures[0])
    head = f"the fit ran to its bound T = {t:g}"
    right = "" if np.isnan(fitted.right) else f"{fitted.right:.0%}"
    if t == BOUNDS[0] and fitted.right == 1.0:
        return (f"{head}: every validation row is already right, so sharper scores lower the "
                "loss without end; nothing there to calibrate against")
    if t == BOUNDS[0]:
        return (f"{head}: the model's scores are nearly flat (median logit spread "
                f"{fitted.spread:.3g}) while its arg-max is right on {right or 'some'} of the "
                "validation rows: a barely trained model whose scores are not probabilities "
                "yet; train it longer")
    chance = f", {1 / fitted.classes:.0%} by chance" if fitted.classes > 1 and right else ""
    return (f"{head}: flatter scores always fit the validation labels better, so the model's "
            f"scores say next to nothing about them (arg-max right on {right or 'few'} of the "
            f"rows{chance}): a model that has not learned the task (yet); train it longer, "
            "and if it did train, check that the labels belong to the texts")


def logit_layer(model) -> torch.nn.Linear | None:
    """The layer that makes the logits: the last Linear with one output per label (BERT's
    `classifier`, RoBERTa's `classifier.out_proj`, GPT-2's and Llama's `score`)."""
    k = model.config.num_labels
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == k]
    return layers[-1] if layers else None


def fold(model, temperatures: np.ndarray, probe: dict) -> str | None:
    """Divide the model's logits by `temperatures` in its weights; check on the `probe` batch
    (host arrays) that its logits became logits / T. Returns None, or why not (the model is then
    as it was)."""
    layer = logit_layer(model)
    if layer is None:
        return f"no Linear layer with {model.config.num_labels} outputs makes its logits"
    device = layer.weight.device
    t = torch.as_tensor(temperatures, dtype=torch.float32, device=device)
    batch = dev.to_device(probe, device)
    with torch.no_grad():
        before = dev.forward(model, batch, probe).float()
        saved = [p.detach().clone() for p in (layer.weight, layer.bias) if p is not None]
        layer.weight.copy_((layer.weight.float() / t[:, None]).to(layer.weight.dtype))
        if layer.bias is not None:
            layer.bias.copy_((layer.bias.float() / t).to(layer.bias.dtype))
        after = dev.forward(model, batch, probe).float()
        # float32 rounding is ~1e-7 of the logits' size; a head that is not linear in them
        # (a squashing function after it) misses by a good share of it
        if (after - before / t).abs().max() <= 1e-4 * before.abs().max() + 1e-6:
            return None
        for param, value in zip((layer.weight, layer.bias), saved):
            param.copy_(value)
    return (f"its logits are not the outputs of its last {model.config.num_labels}-output Linear "
            "layer, so the temperature cannot be folded into its weights")


def save(model, model_dir: Path) -> None:
    """`model_dir` with `model`'s weights, replaced as a whole (outputs.atomic_path): a stage
    killed while writing leaves the exported model as it was."""
    from wellfed.outputs import atomic_path

    with atomic_path(model_dir, is_dir=True) as tmp:
        for entry in model_dir.iterdir():
            if entry.is_dir():
                shutil.copytree(entry, tmp / entry.name)
            elif not WEIGHTS.fullmatch(entry.name):
                shutil.copy2(entry, tmp / entry.name)
        model.save_pretrained(tmp, safe_serialization=True)
        mode = (model_dir / "config.json").stat().st_mode
        for entry in tmp.iterdir():  # transformers writes weights 0600: readable as the rest
            if WEIGHTS.fullmatch(entry.name):
                entry.chmod(mode)


def _shown(temperatures: np.ndarray) -> str:
    if len(temperatures) == 1:
        return f"temperature {temperatures[0]:.3g}"
    return (f"per-label temperatures {temperatures.min():.3g} to {temperatures.max():.3g} "
            f"(median {np.median(temperatures):.3g})")


def calibrate_model(model_dir: Path, data, pad_id: int, task: str, mode: str,
                    threshold: float = 0.5, model=None, logits=None) -> Calibrated:
    """Fit temperatures on the validation token file `data` for the exported model in
    `model_dir` and, as train.calibrate `mode` decides, fold them into its weights there.
    `threshold`: the multi-label decision threshold on the model's scores as they are.
    `model` and its validation `logits`, when the caller has them (train/outputs/export.py): not
    loaded and predicted again."""
    off = {"method": "none"}
    if task == "regression":
        return Calibrated({**off, "reason": "regression: no probabilities"}, {},
                          "calibration: not applicable (regression outputs values, not "
                          "probabilities)", threshold)
    if mode == "none":
        return Calibrated({**off, "reason": "train.calibrate: none"}, {},
                          "calibration: off (train.calibrate: none)", threshold)
    from wellfed.data import coverage
    from wellfed.evaluate.predictions import load_exported, predict_exported

    model_dir = Path(model_dir)
    present = coverage.counts(task, data.labels, label_names(model_dir))
    if (gap := coverage.gap("validation", task, present)) and gap.one_class:
        asked = "WARNING: " if mode == "temperature" else ""
        why = f"validation {gap.problem}: a temperature fitted there says nothing of the others"
        return Calibrated({**off, "reason": f"validation {gap.problem}"},
                          {DETAIL: f"not applied: {why}"},
                          f"{asked}calibration: not applied ({why})", threshold)
    if logits is None:
        model = load_exported(model_dir)
        logits = predict_exported(model, data, pad_id, task, "calibration: validation",
                                  logits=True)
    fitted = fit(task, logits, data.labels, threshold)
    apply, why = decide(mode, fitted)
    if apply:
        if model is None:  # the fold needs the weights, the fit did not
            model = load_exported(model_dir)
        probe = data.gather(np.arange(min(PROBE_ROWS, len(data))), pad_id, 1)
        problem = fold(model, fitted.temperatures, probe)
        if problem:
            apply, why = False, problem
        else:
            save(model, model_dir)
    figures = {"val_ece_before": fitted.ece_before, "val_ece_after": fitted.ece_after}
    record = {"method": "temperature" if apply else "none",
              "temperatures": [float(t) for t in fitted.temperatures],
              "fitted_on": f"validation, {len(data)} rows", **figures,
              "changed_predictions": fitted.changed, "reason": why}
    details = {DETAIL: f"{_shown(fitted.temperatures)} {'applied' if apply else 'not applied'}; "
                    f"ECE on validation {fitted.ece_before:.4f} -> {fitted.ece_after:.4f}"}
    moves = task == "multi_label" and fitted.threshold != threshold
    if moves and apply:
        record["threshold_before"] = threshold
    asked = "WARNING: " if mode == "temperature" and not apply else ""  # asked for, not done
    line = (f"{asked}calibration: {_shown(fitted.temperatures)} fitted on validation ({len(data)} "
            f"rows): ECE {fitted.ece_before:.4f} -> {fitted.ece_after:.4f}, "
            f"{fitted.changed or 'no'} prediction{'' if fitted.changed == 1 else 's'} changed"
            + (f" (threshold {threshold:.4g} -> {fitted.threshold:.4g} on the calibrated "
               "scores)" if moves and apply else "")
            + f"; {'applied' if apply else 'not applied'} ({why})")
    return Calibrated(record, details, line, fitted.threshold if apply else threshold)


def label_names(model_dir: Path) -> list[str]:
    """The exported model's class (or label) names, in id order (its config.json's id2label)."""
    id2label = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))["id2label"]
    return [id2label[str(i)] for i in range(len(id2label))]


def read(model_dir: Path) -> dict:
    """The calibration record of an exported model ({} when it has none)."""
    info = Path(model_dir) / tasks.MODEL_INFO
    return json.loads(info.read_text(encoding="utf-8")).get("calibration", {}) \
        if info.is_file() else {}


def uncalibrated(task: str, probs: np.ndarray, record: dict) -> np.ndarray:
    """The scores the model gave before its temperatures were folded in, from the calibrated
    ones: softmax(T log p) for single-label (softmax ignores the shift), sigmoid(T logit p)
    per label for multi-label."""
    if record.get("method") != "temperature":
        return probs
    t = np.asarray(record["temperatures"], np.float64)
    p = np.clip(np.asarray(probs, np.float64), np.finfo(np.float32).tiny, 1.0)
    if task == "single_label":
        return probabilities(task, np.log(p) * t)
    p = np.minimum(p, 1.0 - np.finfo(np.float64).eps)
    return probabilities(task, (np.log(p) - np.log1p(-p)) * t)
