"""The export: the chosen checkpoint's model.pt -> data/model, a Hugging Face model directory
(weights, tokenizer, label names), calibrated (wellfed/evaluate/temperature.py), with the multi-label
threshold and `wellfed.json` beside it; the profiler trace of the last checkpoint to MLflow."""

from __future__ import annotations

import shutil
from pathlib import Path

from wellfed import tasks
from wellfed.data.token_files import TokenFile
from wellfed.evaluate import temperature
from wellfed.outputs import atomic_path
from wellfed.telemetry.phases import Phases
from wellfed.track import tracking
from wellfed.train import checkpoint


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


def weights(trained, tokens_dir: Path, model_out: Path, uri: str, run_id: str) -> list[dict]:
    """The chosen checkpoint -> HF model directory (weights + tokenizer + label names); return
    the per-step history (the last checkpoint's). `trained` is the driver's Trained. A profiler
    trace in the last checkpoint goes to MLflow under `profile/`."""
    store = trained.store
    with store.local(trained.chosen) as chosen, atomic_path(model_out, is_dir=True) as tmp:
        write_model(chosen, trained.job, tokens_dir, tmp)
    with store.local(trained.last) as last:
        state = checkpoint.read_state(last)
        if (last / checkpoint.PROFILE).is_dir():
            tracking.log_artifacts(uri, run_id, last / checkpoint.PROFILE, checkpoint.PROFILE)
            print(f"[wellfed] profiler trace + top operators logged to MLflow run {run_id} "
                  "under profile/ (open the trace in https://ui.perfetto.dev)")
    return state.history


def export(trained, tokens_dir: Path, meta: dict, train_cfg, model_dir: Path, uri: str,
           run_id: str, clock: Phases) -> list[dict]:
    """data/model, whole: the weights (`weights`), calibrated, the multi-label threshold
    (train.threshold, tuned on validation when `tune`), `wellfed.json`; returns the history."""
    task, pad_id = meta.get("task", "single_label"), meta["pad_id"]
    with clock("export"):
        history = weights(trained, tokens_dir, model_dir, uri, run_id)
    fixed = train_cfg.threshold if train_cfg.threshold != "tune" else tasks.VAL_THRESHOLD
    validation = TokenFile(tokens_dir / "validation.arrow")
    tune = task == "multi_label" and train_cfg.threshold == "tune"
    model = logits = None
    if task != "regression" and (tune or train_cfg.calibrate != "none"):
        from wellfed.evaluate import predictions

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
    tracking.set_tags(uri, run_id, calibrated.tags)
    info = {"task": task, "text_columns": meta.get("text_columns", ["text"]),
            "threshold": calibrated.threshold if task == "multi_label" else tasks.VAL_THRESHOLD,
            "max_length": meta.get("max_length", 128), "calibration": calibrated.record}
    if task == "multi_label" and train_cfg.threshold == "tune":
        tracking.log_metrics(uri, run_id, {"train/threshold": info["threshold"]})
    tasks.write_model_info(model_dir, info)  # predict/serve read it beside config.json
    return history
