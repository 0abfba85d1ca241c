"""The export: the chosen checkpoint's model.pt -> data/model, a Hugging Face model directory
(weights, tokenizer, label names), calibrated (wellfed/evaluate/temperature.py), with the multi-label
threshold and `wellfed.json` beside it; the profiler trace of the last checkpoint to MLflow."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from wellfed import tasks
from wellfed.data.token_files import TokenFile
from wellfed.evaluate import predictions, temperature
from wellfed.outputs import atomic_path
from wellfed.telemetry.phases import Phases
from wellfed.track import run_details, tracking
from wellfed.train.checkpoints import checkpoint


def write_hf(ckpt: Path, job, out: Path) -> None:
    """A checkpoint's model.pt -> HF model directory: the model is rebuilt as the workers built
    it and given the checkpoint's weights (on this CPU, fp32; LoRA adapters merged)."""
    from wellfed.model import load_model

    model = load_model(job.model, job.model_source, list(job.labels), job.pad_id, task=job.task)
    model.load_state_dict(checkpoint.weights(ckpt))
    checkpoint.save_hf(model, out)


def write_model(ckpt: Path, job, tokens_dir: Path, out: Path) -> None:
    """A checkpoint -> a model directory `pipeline()` loads: its weights and the tokenizer."""
    write_hf(ckpt, job, out)
    shutil.copytree(tokens_dir / "tokenizer", out, dirs_exist_ok=True)


def weights(trained, tokens_dir: Path, model_out: Path, uri: str,
            run_id: str) -> tuple[list[dict], np.ndarray | None]:
    """The chosen checkpoint -> HF model directory (weights + tokenizer + label names); return
    the per-step history (the last checkpoint's) and the checkpoint's validation logits (None
    when it has none: several workers, or a step that did not validate). `trained` is the
    driver's Trained. A profiler trace in the last checkpoint goes to MLflow under `profile/`."""
    store = trained.store
    with store.local(trained.chosen) as chosen, atomic_path(model_out, is_dir=True) as tmp:
        write_model(chosen, trained.job, tokens_dir, tmp)
        logits = (np.load(chosen / checkpoint.VAL_LOGITS)
                  if (chosen / checkpoint.VAL_LOGITS).is_file() else None)
    with store.local(trained.last) as last:
        state = checkpoint.read_state(last)
        if (last / checkpoint.PROFILE).is_dir():
            tracking.log_artifacts(uri, run_id, last / checkpoint.PROFILE, checkpoint.PROFILE)
            print(f"[wellfed] profiler trace + top operators logged to MLflow run {run_id} "
                  "under profile/ (open the trace in https://ui.perfetto.dev)")
    return state.history, logits


def export(trained, tokens_dir: Path, meta: dict, train_cfg, model_dir: Path, uri: str,
           run_id: str, clock: Phases) -> tuple[list[dict], np.ndarray | None]:
    """data/model, whole: the weights (`weights`), calibrated, the multi-label threshold
    (train.threshold, tuned on validation when `tune`), `wellfed.json`; returns the history
    and the exported model's outputs on the validation split (calibrated, in file order; None
    when no validation logits were at hand), which evaluate scores instead of predicting again
    when validation is its split. The threshold and the calibration share one set of logits:
    the chosen checkpoint's own, else one pass of the exported model."""
    task, pad_id = meta.get("task", "single_label"), meta["pad_id"]
    with clock("export"):
        history, logits = weights(trained, tokens_dir, model_dir, uri, run_id)
    fixed = train_cfg.threshold if train_cfg.threshold != "tune" else tasks.VAL_THRESHOLD
    validation = TokenFile(tokens_dir / "validation.arrow")
    tune = task == "multi_label" and train_cfg.threshold == "tune"
    model = None
    if logits is None and task != "regression" and (tune or train_cfg.calibrate != "none"):
        with clock("validation pass"):  # once, for the threshold and the calibration
            model, logits = predictions.validation_logits(model_dir, validation, pad_id, task)
    if tune:
        with clock("threshold"):  # on the scores as trained: calibration then keeps its decisions
            fixed, f1, half = predictions.threshold_on(
                validation.labels, temperature.probabilities(task, logits))
        print(f"[wellfed] multi-label threshold {fixed:g}: validation macro-F1 {f1:.4f} "
              f"(at 0.5: {half:.4f})")
    with clock("calibration"):
        calibrated = temperature.calibrate_model(model_dir, validation, pad_id, task,
                                                 train_cfg.calibrate, float(fixed), model, logits)
    print(f"[wellfed] {calibrated.line}")
    if calibrated.details:  # the run's details, not a tag: read once, filtered by no one
        run_details.update(uri, run_id, calibrated.details)
    info = {"task": task, "text_columns": meta.get("text_columns", ["text"]),
            "threshold": calibrated.threshold if task == "multi_label" else tasks.VAL_THRESHOLD,
            "max_length": meta.get("max_length", 128), "calibration": calibrated.record}
    if tune:
        tracking.log_metrics(uri, run_id, {"train/threshold": info["threshold"]})
    tasks.write_model_info(model_dir, info)  # predict/serve read it beside config.json
    outputs = None
    if logits is not None:  # what the exported model gives: its temperatures folded in
        scale = (calibrated.record["temperatures"]
                 if calibrated.record.get("method") == "temperature" else 1.0)
        outputs = temperature.probabilities(task, logits, scale).astype(np.float32)
    return history, outputs


def write_validation_outputs(path: Path, outputs: np.ndarray | None, tokens_dir: Path) -> None:
    """The exported model's validation outputs with their row ids (evaluate checks them against
    the token file); no rows when there were none at hand."""
    data = TokenFile(tokens_dir / "validation.arrow")
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, outputs=np.zeros((0, 0), np.float32) if outputs is None else outputs,
                 row_ids=data.row_ids if outputs is not None else np.zeros(0, np.int64))
