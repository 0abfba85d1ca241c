"""train: token files -> fine-tuned model (in this process, or on Ray Train workers), recorded in
one MLflow run: fit -> export -> reports -> register -> complete.

usage: python stages/train.py TOKENS_DIR MODEL_DIR TRAIN_DIR CHECKPOINT_DIR
"""

import json
import sys
import time
from pathlib import Path

from wellfed import heap, watchdog
from wellfed.cli import one_line, stage
from wellfed.config import SECTIONS, flatten, load_params
from wellfed.model import resolve_source
from wellfed.telemetry import diagnosis
from wellfed.telemetry.phases import split_train
from wellfed.track import provenance, registry, run_details, run_note, sweeps, tracking, ui_links
from wellfed.train.checkpoints import preemption
from wellfed.train.outputs import export, reports, run_record
from wellfed.train.run import driver, orphan
from wellfed.train.run.mlflow_run import marked_failed
from wellfed.train.run.preflight import check_stores


@stage(work="steps")
def main(tokens_dir, model_dir, train_dir, checkpoint_dir, *, budget):
    clock, started = budget.clock, time.time()
    with clock("params"):
        model_cfg, train_cfg, data_cfg, ray_cfg, mlflow_cfg = load_params(
            "params.yaml", "model", "train", "data", "ray", "mlflow")
        # MLflow records the whole loaded config, defaults included, not only what the file
        # says; not the search section, which no pipeline run reads (wellfed-search does).
        recorded = [name for name in SECTIONS if name != "search"]
        params = flatten(dict(zip(recorded, load_params("params.yaml", *recorded))))
    tokens, out, model_dir = Path(tokens_dir), Path(train_dir), Path(model_dir)
    meta = json.loads((tokens / "meta.json").read_text())
    source = resolve_source(meta["model_source"])  # model.name as written: on this machine
    uri = tracking.tracking_uri(mlflow_cfg.tracking_uri, Path.cwd())
    check_stores(uri, mlflow_cfg.tracking_uri, Path.cwd())  # before any work: one line if not
    try:
        trained, run_id, info = driver.fit(
            tokens_dir=tokens, model_source=source, labels=meta["labels"],
            pad_id=meta["pad_id"], task=meta.get("task", "single_label"), model_cfg=model_cfg,
            train_cfg=train_cfg, data_cfg=data_cfg, ray_cfg=ray_cfg,
            storage=Path(checkpoint_dir), uri=uri, experiment=mlflow_cfg.experiment,
            params=params, tags={**provenance.git_tags(Path.cwd()), **sweeps.tags(
                uri, mlflow_cfg.experiment, mlflow_cfg.sweep)}, clock=clock,
            outputs=(model_dir, out))
    except preemption.Stopped as stop:  # SIGTERM (SLURM, spot) or Ctrl-C: its line was said
        sys.exit(stop.exit_code)        # as training stopped; 128 + the signal
    except orphan.Recorded as done:  # finished after its dvc had gone: dvc records it now
        print(f"[wellfed] {done}")
        return
    watchdog.finish_when_orphaned()  # dvc gone from here on: the outputs are seconds away
    heap.settle()  # trained: the export and MLflow's passes need not walk torch's heap again
    with marked_failed(uri, run_id):  # the stage fails after training: so does the MLflow run
        history, outputs = export.export(trained, tokens, meta, train_cfg, model_dir, uri, run_id,
                                         clock)
        export.write_validation_outputs(out / "validation_outputs.npz", outputs, tokens)
        # Every process of a resumed run counts: earlier ones recorded their seconds in the store.
        seconds = info["seconds_before"] + time.time() - started
        with clock("history + plots + diagnosis"):
            text, figures = reports.write_reports(history, uri, run_id, out, data_cfg, train_cfg,
                                                  ray_cfg.cpus_per_worker)
        for line in diagnosis.console(figures):  # as text; speed/diagnosis.md keeps the Markdown
            print(f"[wellfed] {line}")
        metrics = reports.summarize(history, seconds, figures, trained.best, trained.chosen.step)
        reports.write_metrics(metrics, out)  # DVC's: the headline; speed/: this machine's
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
        tracking.log_metrics(uri, run_id, {k: v for k, v in metrics.items()
                                           if k.startswith("train/")}, model_id=model.get("model_id"))
        run_details.update(uri, run_id, {run_note.DIAGNOSIS: run_note.diagnosis_line(text)})
        run_note.write(uri, run_id, meta.get("task", "single_label"), meta["labels"], model=model)
        run_record.write(out / "run.json", model_dir, {"mlflow_run_id": run_id,
                                                       "tracking_uri": uri,
                                                       "ray_run": info["name"], **model})
        driver.complete(trained, info, run_id, uri, model, model_dir)
    try:  # a diagnostic: it must not fail a stage whose outputs are all written
        clock.seconds = split_train(clock.seconds, reports.take_worker_seconds(uri, run_id, started))
        total = time.time() - budget.started_at
        tracking.log_metrics(uri, run_id, {"time/stage_s": total, "time/fixed_s": total
                                           - clock.seconds.get("steps", 0.0)})
    except Exception as err:
        print(f"[wellfed] WARNING: no time budget from the loop ({type(err).__name__}: "
              f"{one_line(err)})", file=sys.stderr)
    shown = ", ".join(f"{k} {v:.4g}" if abs(v) < 1000 else f"{k} {v:.0f}"
                      for k, v in metrics.items())
    print(f"[wellfed] train done: {shown} (MLflow run {run_id})")


if __name__ == "__main__":
    main()
