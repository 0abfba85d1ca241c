"""train: token files -> fine-tuned model (in this process, or on Ray Train workers), recorded in
one MLflow run.

usage: python stages/train.py TOKENS_DIR MODEL_DIR TRAIN_DIR CHECKPOINT_DIR
"""

import time

STARTED = time.time()  # before the imports below: they are part of the stage's fixed cost

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from wellfed import registry, run_note, tasks, temperature, tracking, ui_links  # noqa: E402
from wellfed.cli import one_line, stage  # noqa: E402
from wellfed.config import SECTIONS, flatten, load_params  # noqa: E402
from wellfed.data.shards import TokenFile  # noqa: E402
from wellfed.outputs import write_json  # noqa: E402
from wellfed.telemetry.phases import Phases, stage_breakdown  # noqa: E402
from wellfed.train import driver, preemption, runs  # noqa: E402


@stage
def main(tokens_dir, model_dir, train_dir, checkpoint_dir):
    model_cfg, train_cfg, data_cfg, ray_cfg, mlflow_cfg = load_params(
        "params.yaml", "model", "train", "data", "ray", "mlflow")
    # MLflow records the whole loaded config, defaults included, not just what the file spells out.
    params = flatten(dict(zip(SECTIONS, load_params("params.yaml", *SECTIONS))))
    tokens, out = Path(tokens_dir), Path(train_dir)
    meta = json.loads((tokens / "meta.json").read_text())
    task = meta.get("task", "single_label")
    uri = tracking.tracking_uri(mlflow_cfg.tracking_uri, Path.cwd())
    started, clock = time.time(), Phases({"imports + params": time.time() - STARTED})
    try:
        checkpoint, run_id, info = driver.fit(
            tokens_dir=tokens, model_source=meta["model_source"], labels=meta["labels"],
            pad_id=meta["pad_id"], task=task, model_cfg=model_cfg, train_cfg=train_cfg,
            data_cfg=data_cfg, ray_cfg=ray_cfg, storage=Path(checkpoint_dir), uri=uri,
            experiment=mlflow_cfg.experiment, params=params, tags=tracking.git_tags(Path.cwd()),
            clock=clock)
    except preemption.Stopped as stop:  # SIGTERM (SLURM, spot) or Ctrl-C: one line, 128 + signal
        print(f"[wellfed] {stop}", file=sys.stderr, flush=True)
        sys.exit(stop.exit_code)
    with clock("export"):
        history = driver.export_model(checkpoint, tokens, Path(model_dir), uri, run_id)
    fixed = train_cfg.threshold if train_cfg.threshold != "tune" else tasks.VAL_THRESHOLD
    with clock("calibration"):  # before the threshold is tuned: it is tuned on these scores
        calibrated = temperature.calibrate_model(
            Path(model_dir), TokenFile(tokens / "validation.arrow"), meta["pad_id"], task,
            train_cfg.calibrate, float(fixed))
    print(f"[wellfed] {calibrated.line}")
    tracking.set_tags(uri, run_id, calibrated.tags)
    model_info = {"task": task, "text_columns": meta.get("text_columns", ["text"]),
                  "threshold": float(fixed) if task == "multi_label" else tasks.VAL_THRESHOLD,
                  "max_length": meta.get("max_length", 128), "calibration": calibrated.record}
    if task == "multi_label" and train_cfg.threshold == "tune":
        from wellfed import evaluation

        with clock("threshold"):
            model_info["threshold"], f1, half = evaluation.threshold_on(
                model_dir, TokenFile(tokens / "validation.arrow"), meta["pad_id"])
        print(f"[wellfed] multi-label threshold {model_info['threshold']:g}: validation macro-F1 "
              f"{f1:.4f} (at 0.5: {half:.4f})")
        tracking.log_metrics(uri, run_id, {"train/threshold": model_info["threshold"]})
    tasks.write_model_info(Path(model_dir), model_info)  # predict/serve read it beside config.json
    seconds = time.time() - started
    with clock("history + plots + diagnosis"):
        text, figures = driver.write_reports(history, uri, run_id, out, data_cfg, train_cfg)
    print(text)

    metrics = driver.summarize(history, seconds, figures, checkpoint.best)
    write_json(out / "metrics.json", metrics)  # the DVC metrics: headline only, MLflow's names
    try:  # a model MLflow could not take must not cost the training: data/model holds it
        with clock("mlflow model + registry"):
            tracking.log_datasets(uri, run_id, tokens)
            model = registry.register(uri, run_id, model_dir, mlflow_cfg.model_name())
        name, version = model["registered_model"], model["model_version"]
        print(f"[wellfed] model registered: models:/{name}/{version}; in the UI: "
              f"{ui_links.model_version(uri, name, version)}")
    except Exception as err:
        model = {}
        print(f"[wellfed] WARNING: the model was not logged to MLflow ({type(err).__name__}: "
              f"{one_line(err)}); it is in {model_dir}", file=sys.stderr)
    # val/* are already in the run, logged at their steps; the rest are the run's (and model's).
    tracking.log_metrics(uri, run_id, {k: v for k, v in metrics.items() if k.startswith("train/")},
                         model_id=model.get("model_id"))
    tracking.set_tags(uri, run_id, {run_note.DIAGNOSIS: run_note.diagnosis_line(text)})
    run_note.write(uri, run_id, task, meta["labels"], model=model)  # evaluate adds the test
    write_json(out / "run.json", {"mlflow_run_id": run_id, "tracking_uri": uri,
                                  "ray_run": info["name"], **model})
    runs.mark_complete(info, run_id)
    try:  # a diagnostic: it must not fail a stage whose outputs are all written
        print(f"[wellfed] train stage {stage_breakdown(clock, STARTED, uri, run_id)}")
    except Exception as err:
        print(f"[wellfed] WARNING: no time breakdown ({type(err).__name__}: {one_line(err)})",
              file=sys.stderr)
    shown = ", ".join(f"{k} {v:.4g}" if abs(v) < 1000 else f"{k} {v:.0f}"
                      for k, v in metrics.items())
    print(f"[wellfed] train done: {shown} (MLflow run {run_id})")


if __name__ == "__main__":
    main()
