"""The train stage's reports, under the names MLflow shows them by, in two kinds:

- what the run learned, the same bytes whenever the same inputs train again: the headline
  figures (data/train/metrics.json), the loss and validation histories and their plots. DVC
  outputs, committed: the baseline the README quotes, compared by `dvc exp show`/`dvc plots`;
- how fast it went on this machine, different on every run: the speed figures, the throughput
  history and its plots, the diagnosis (data/train/speed/). Not DVC outputs (their hashes in
  dvc.lock changed on every run: `make run` on a fresh clone left dvc.lock and seven committed
  files modified), gitignored; in MLflow with the rest of the run.
"""

from __future__ import annotations

from pathlib import Path

from wellfed.config import DataConfig, TrainConfig
from wellfed.outputs import atomic_path, write_json
from wellfed.track import run_details, tracking, worker_metrics

SPEED = "speed"
"""The train folder's subfolder for this machine's speed reports (gitignored, not in dvc.lock)."""

SPEED_FIGURES = ("train/seconds", "train/real_tokens_per_s", "train/padding_efficiency",
                 "train/input_wait_share", "train/mfu")
"""`summarize`'s figures that go to speed/metrics.json, not the committed metrics.json (padding
efficiency reproduces, but it is the diagnosis' figure, beside the rest of it)."""


def summarize(history: list[dict], seconds: float, figures, best=None,
              model_step: int | None = None) -> dict:
    """The train stage's figures, under the names MLflow shows them by: the exported model's
    validation (`val/*`, the validation at `model_step`: with train.select: best the best
    one, so `dvc exp show` ranks experiments by the models they exported), the last validation
    as `val_last/*` when it was another step (MLflow keeps every validation at its step), the
    step of the best one (`train/best_step`, from the `best` record), the rows trained
    (`train/rows`: an epoch's batches are cut per length pool, so a pool's last batch may be
    short: 16 steps of 32 trained 504 rows on the demo data), and SPEED_FIGURES: the run's
    training wall time over all its processes and its means over report intervals from the
    diagnosis `figures` (a `RunFigures`). Aggregations: docs/compare.md, "Headline metrics"."""
    evals = [h for h in history if "val/loss" in h]
    model = next((h for h in evals if h["step"] == model_step), None) if model_step else None
    model = model or (evals[-1] if evals else None)  # no step given: the last, as exported
    out = {k: v for k, v in model.items() if k.startswith("val/")} if model else {}
    if model is not None and evals[-1] is not model:
        out.update({f"val_last/{k.removeprefix('val/')}": v for k, v in evals[-1].items()
                    if k.startswith("val/")})
    if best is not None and best.step:  # a train/checkpoints/state.py Best
        out["train/best_step"] = best.step
    return {**out, "train/rows": int(sum(h["rows"] for h in history)),
            "train/seconds": round(seconds, 1),
            "train/real_tokens_per_s": figures.real_tokens_per_s,
            "train/padding_efficiency": figures.padding_efficiency,
            "train/input_wait_share": figures.input_wait_share, "train/mfu": figures.mfu}


def write_metrics(metrics: dict, out: Path) -> None:
    """The headline (out/metrics.json, DVC's metrics) and the speed figures
    (out/speed/metrics.json)."""
    write_json(out / "metrics.json", {k: v for k, v in metrics.items() if k not in SPEED_FIGURES})
    write_json(out / SPEED / "metrics.json",
               {k: v for k, v in metrics.items() if k in SPEED_FIGURES})


def write_history(history: list[dict], directory: Path) -> None:
    """CSV files that `dvc plots show` draws: per-step loss/lr/grad norm and the validation
    points."""
    import pandas as pd

    frame = pd.DataFrame(history)
    with atomic_path(directory, is_dir=True) as tmp:
        frame[["step", "loss", "lr", "grad_norm"]].to_csv(tmp / "steps.csv", index=False)
        if "val/loss" in frame:  # the task's figures: val_accuracy, val_macro_f1, val_pearson...
            keys = [k for k in frame if k.startswith("val/")]
            val = frame.dropna(subset=["val/loss"])[["step", *keys]]
            val.rename(columns={k: k.replace("/", "_") for k in keys}).to_csv(
                tmp / "validation.csv", index=False)


def write_reports(history: list[dict], uri: str, run_id: str, out: Path, data_cfg: DataConfig,
                  train_cfg: TrainConfig, cpus: int = 1):
    """The train stage's reports under `out`: history/*.csv and plots/ (what it learned), and
    speed/ (perf.csv, the throughput curve: tracking.metric_table of worker_metrics.PERF_CURVE,
    MLflow's own figures under MLflow's names; its plots; diagnosis.md/.json); the plots and
    the diagnosis also in the MLflow run. `cpus`: each worker's ray.cpus_per_worker. Return
    (the diagnosis text, its figures)."""
    import pandas as pd

    from wellfed.telemetry import diagnosis, plots

    write_history(history, out / "history")
    with atomic_path(out / "plots", is_dir=True) as tmp:
        plots.plot_history(out / "history", tmp)
    tracking.log_artifacts(uri, run_id, out / "plots", "plots")
    figures = diagnosis.figures_from_history(
        tracking.metric_histories(uri, run_id, ("workers/", "worker")),
        data_cfg.loader_workers, train_cfg.micro_batch_size, cpus)
    text, diag = diagnosis.report(figures)
    with atomic_path(out / SPEED, is_dir=True) as tmp:
        pd.DataFrame(tracking.metric_table(uri, run_id, worker_metrics.PERF_CURVE)).to_csv(
            tmp / "perf.csv", index=False)
        (tmp / "plots").mkdir()
        plots.plot_history(tmp, tmp / "plots")
        (tmp / "diagnosis.md").write_text(text, encoding="utf-8")
        write_json(tmp / "diagnosis.json", diag)
    tracking.log_artifacts(uri, run_id, out / SPEED / "plots", "plots")
    tracking.log_text(uri, run_id, text, "diagnosis.md")
    return text, figures


def take_worker_seconds(uri: str, run_id: str, since: float) -> dict[str, float]:
    """Rank 0's seconds per part of the loop (setup, steps, validation...) from the run tag
    worker_metrics.WORKER_TIME its last report left; {} when that report came before `since`
    (epoch seconds: a resumed run's tag may be the interrupted attempt's). The tag carries them
    from the reports (in the Ray Train controller, maybe) to the stage's end: here they move
    into the run's details (`worker_seconds`) and the tag goes, one chip fewer on the run page."""
    import json

    import mlflow

    client = mlflow.MlflowClient(uri)
    tag = client.get_run(run_id).data.tags.get(worker_metrics.WORKER_TIME)
    record = json.loads(tag) if tag else {}
    seconds = record.get("seconds", {}) if record.get("at", 0) >= since else {}
    if seconds:
        run_details.update(uri, run_id, {"worker_seconds": seconds})
    if tag:
        client.delete_tag(run_id, worker_metrics.WORKER_TIME)
    return seconds
