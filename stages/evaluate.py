"""evaluate: score the test split (validation when there is none) and append to the MLflow run.

usage: python stages/evaluate.py TOKENS_DIR MODEL_DIR RUN_JSON VALIDATION_OUTPUTS EVAL_DIR

On the validation split (no test split) it scores the exported model's outputs that the train
stage computed on it (VALIDATION_OUTPUTS): the same model, not predicted a second time.
"""

import json
from pathlib import Path

from wellfed.cli import stage
from wellfed.compare import sweep_summary
from wellfed.config import load_params
from wellfed.data.token_files import TokenFile
from wellfed.evaluate import files, predictions, scores, temperature
from wellfed.outputs import check_room, write_json
from wellfed.track import eval_tracking, tracking, ui_links
from wellfed.train.outputs import run_record
from wellfed.use import serving


@stage
def main(tokens_dir, model_dir, run_json, validation_outputs, eval_dir, *, budget):
    clock, tokens, out = budget.clock, Path(tokens_dir), Path(eval_dir)
    with clock("params"):
        (mlflow_cfg,) = load_params("params.yaml", "mlflow")
    meta = json.loads((tokens / "meta.json").read_text())
    split = "test" if (tokens / "test.arrow").is_file() else "validation"
    data = TokenFile(tokens / f"{split}.arrow")
    run = run_record.read(run_json, model_dir)  # this machine's MLflow run of data/model
    # Before predicting: data/eval and a local MLflow store (which gets a copy) take the
    # predictions (8 bytes a score) and the plots.
    need = len(data) * (len(meta["labels"]) + 4) * 8 + 2_000_000
    store = tracking.local_store(run["tracking_uri"])
    check_room({out: need, **({store: need} if store else {})})
    names, spec = meta["labels"], serving.read_spec(model_dir)
    task, threshold = spec.task, spec.threshold
    outputs = predictions.from_training(Path(validation_outputs), data) \
        if split == "validation" else None  # the train stage scored the exported model on it
    if outputs is None:
        with clock("model load"):
            model = predictions.load_exported(model_dir)
        with clock("predict"):
            outputs = predictions.predict_exported(model, data, meta["pad_id"], task,
                                                   f"evaluate: {split}")
    with clock("scores"):
        metrics = {"split": split, "task": task,
                   **scores.score_task(task, data.labels, outputs, names, threshold),
                   **scores.calibration(task, data.labels, outputs)}  # {} for regression
        record = temperature.read(model_dir)  # folded into the weights: `outputs` are calibrated
        if record.get("method") == "temperature":
            metrics["ece_uncalibrated"] = scores.calibration(
                task, data.labels, temperature.uncalibrated(task, outputs, record))["ece"]
    with clock("predictions + plots"):
        metrics.update(files.write(out, data, outputs, names, task, threshold, metrics))
    write_json(out / "report.json", metrics)  # per-class scores, confusion matrix: the detail
    figures = {f"eval/{k}": metrics[k] for k in scores.HEADLINE[task]}
    write_json(out / "metrics.json", figures)  # the DVC metrics: MLflow's names and values
    with clock("mlflow logging + champion"):
        if "ece_uncalibrated" in metrics:  # the exported head is calibrated (train.calibrate)
            eval_tracking.calibration(run["tracking_uri"], run["mlflow_run_id"],
                                      metrics["ece_uncalibrated"], metrics["ece"])
        tracking.log_artifacts(run["tracking_uri"], run["mlflow_run_id"], out, "eval")
        verdict, page = eval_tracking.record(
            run, metrics, figures, task, names, split,
            eval_tracking.split_fingerprint(meta, tokens, split), mlflow_cfg.champion_alias)
    print(f"[wellfed] {scores.headline_line(metrics, task, split, threshold)}")
    if verdict is not None:
        print(f"[wellfed] {verdict.line()}")
    print(f"[wellfed] MLflow run: {ui_links.offered(run['tracking_uri'], page)}")
    with clock("sweep summary"):  # a sweep's trial: its parent run's summary, brought up to date
        if line := sweep_summary.after_trial(run["tracking_uri"], run["mlflow_run_id"]):
            print(f"[wellfed] {line}")
    with clock("mlflow logging + champion"):  # the pipeline's seconds, this stage's so far
        if (line := eval_tracking.pipeline_time(run, budget)) is not None:
            budget.after.append(line)


if __name__ == "__main__":
    main()
