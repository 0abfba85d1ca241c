"""The evaluate stage's part of the MLflow run: the headline test figures (linked to the logged
model and the split's dataset), one per-class table, the champion decision, the run note, and
the experiment's headline view of its runs table (track/runs_view.py), saved once.

Per-class figures are one table artifact, not metric keys: a run's metric count stays the same
whatever the number of classes (Banking77's 77 intents made 231 keys of 3 per class), and a
table is where a person reads them anyway. `data/eval/report.json` has them as well.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from wellfed.track import champion, registry, run_details, run_note, runs_view, tracking, ui_links


def table_file(task: str) -> str:
    """The per-class (regression: per-target) table's artifact path in the run."""
    return "eval/per_target.json" if task == "regression" else "eval/per_class.json"


def per_class_frame(report: dict):
    """One row per class (or target): its safe key, its label text and its figures."""
    import pandas as pd

    rows = report.get("per_class") or report.get("per_target") or {}
    return pd.DataFrame([{"key": key, **scores} for key, scores in rows.items()])


def log_table(uri: str, run_id: str, frame, artifact_file: str) -> None:
    """The table as MLflow's table artifact (the UI shows it as a table). `log_table` appends
    to a table the run already has, and evaluate may run again on the same run (its code
    changed, training did not): then the same JSON replaces the file instead."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    folder = artifact_file.rsplit("/", 1)[0]
    if any(f.path == artifact_file for f in client.list_artifacts(run_id, folder)):
        client.log_text(run_id, frame.to_json(orient="split", index=False), artifact_file)
    else:
        client.log_table(run_id, frame, artifact_file)


def split_fingerprint(meta: dict, tokens_dir: Path, split: str) -> str:
    """The tokenize stage's fingerprint of the split (its rows, texts and labels); token files
    made before it existed: the token file's sha256, which no other tokenizer matches (such a
    version is then ranked only against versions of the same token file)."""
    known = meta.get("split_fingerprints", {}).get(split)
    if known:
        return known
    h = hashlib.sha256()
    with open(tokens_dir / f"{split}.arrow", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record(run: dict, report: dict, figures: dict[str, float], task: str, labels: list[str],
           split: str, fingerprint: str, alias: str):
    """Log the evaluation into the train stage's run (`run`: data/train/run.json) and rank its
    registered version; return (the champion.Verdict or None, the run page's address)."""
    import mlflow

    uri, run_id = run["tracking_uri"], run["mlflow_run_id"]
    tracking.log_metrics(uri, run_id, figures, model_id=run.get("model_id"),
                         dataset=tracking.dataset_digest(uri, run_id, f"tokens/{split}"))
    frame = per_class_frame(report)
    if len(frame):
        log_table(uri, run_id, frame, table_file(task))
    verdict = None
    if alias and run.get("model_version"):
        metric = registry.headline(task)
        verdict = champion.promote(uri, run["registered_model"], run["model_version"], alias,
                                   metric, figures[metric], fingerprint, split)
        registry.mark_aliases(uri)  # the runs table's alias column
    run_note.write(uri, run_id, task, labels, model=run, verdict=verdict,
                   evaluation={"split": split, "rows": report["rows"], "figures": figures,
                               "table": table_file(task)})
    experiment = mlflow.MlflowClient(uri).get_run(run_id).info.experiment_id
    runs_view.save(uri, experiment, runs_view.headline(list(figures)))  # once per experiment
    return verdict, ui_links.run(uri, experiment, run_id)


def pipeline_time(run: dict, budget) -> str | None:
    """The pipeline run's seconds into the MLflow run: every stage that this stage's dvc
    process ran (their budgets beside this one's, telemetry/budget.py) as `time/pipeline.json`,
    the metric `time/pipeline_s` (one key: the run's metric list stays short) and the run
    details' `pipeline_time` (the line, with the fixed cost); returns the line, or None outside
    dvc or without a budget file to find the others by."""
    import json

    from wellfed.telemetry import budget as budgets

    if budget.path is None:
        return None
    summary = budgets.pipeline(budget.path.parent, budget.record())
    if summary is None:
        return None
    uri, run_id, line = run["tracking_uri"], run["mlflow_run_id"], budgets.pipeline_line(summary)
    tracking.log_metrics(uri, run_id, {"time/pipeline_s": summary["total_s"]})
    run_details.update(uri, run_id, {PIPELINE_TIME: line})
    tracking.log_text(uri, run_id, json.dumps(summary, indent=1), "time/pipeline.json")
    return line


PIPELINE_TIME = "pipeline_time"
"""The run details' key of the pipeline run's time line (track/run_details.py)."""


def calibration(uri: str, run_id: str, before: float, after: float) -> None:
    """Add the test split's ECE before -> after the exported model's calibration to the run
    details' calibration line (temperature.DETAIL, which the train stage wrote); a rerun
    replaces it."""
    from wellfed.evaluate.temperature import DETAIL

    known = run_details.read(uri, run_id).get(DETAIL, "")
    line = known.split(", on test ")[0] + f", on test {before:.4f} -> {after:.4f}"
    run_details.update(uri, run_id, {DETAIL: line})
