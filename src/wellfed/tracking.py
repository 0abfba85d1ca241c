"""MLflow run lifecycle and driver-side logging of every worker's reports.

One MLflow run per pipeline run: the train stage opens it and writes its id to a small file that
evaluate reads to append its own metrics. Workers never talk to MLflow; the Ray Train controller
calls `MlflowCallback.after_report` with every worker's metrics and it logs them at their steps.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ray.train

SECRET_PATTERN = re.compile(r"(token|secret|password|passwd|api[_-]?key|credential|aws_)", re.I)


def tracking_uri(configured: str, project_root: str | Path) -> str:
    """$MLFLOW_TRACKING_URI, else params, else an absolute sqlite URI (Ray workers run elsewhere)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or configured
    if uri:
        return uri
    root = Path(os.environ.get("DVC_ROOT") or project_root).resolve()
    return f"sqlite:///{root / 'mlflow.db'}"


def scrub(params: dict[str, Any]) -> dict[str, Any]:
    """Drop anything whose key looks like a secret; never let a credential reach MLflow."""
    return {k: v for k, v in params.items() if not SECRET_PATTERN.search(k)}


def git_tags(root: Path) -> dict[str, str]:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    tags = {"git.commit": git("rev-parse", "HEAD") or "unknown",
            "git.dirty": str(bool(git("status", "--porcelain", "--untracked-files=no"))).lower()}
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc.exp_name"] = os.environ["DVC_EXP_NAME"]
    return tags


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "tokenizers", "pyarrow", "ray", "mlflow", "dvc"):
        try:
            out[f"version.{name}"] = version(name)
        except PackageNotFoundError:
            pass
    return out


def start_run(uri: str, experiment: str, run_name: str, run_id: str | None = None) -> str:
    """Create (or reopen, for a resume) the pipeline's MLflow run; return its id."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    if run_id:
        try:
            client.get_run(run_id)
            return run_id
        except mlflow.exceptions.MlflowException:
            pass
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    return client.create_run(exp_id, run_name=run_name).info.run_id


def log_params(uri: str, run_id: str, params: dict[str, Any], tags: dict[str, str]) -> None:
    import mlflow
    from mlflow.entities import Param, RunTag

    client = mlflow.MlflowClient(uri)
    existing = client.get_run(run_id).data.params
    fresh = [Param(k, str(v)[:6000]) for k, v in scrub(params).items() if k not in existing]
    for i in range(0, len(fresh), 100):
        client.log_batch(run_id, params=fresh[i:i + 100])
    client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in scrub(tags).items()])


def log_metrics(uri: str, run_id: str, metrics: dict[str, float], step: int | None = None) -> None:
    import mlflow
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
    client = mlflow.MlflowClient(uri)
    for i in range(0, len(batch), 500):
        client.log_batch(run_id, metrics=batch[i:i + 500])


def interval_metrics(reports: list[dict]) -> dict[str, float]:
    """Throughput of one report interval from all workers' reports (rank-keyed + aggregates)."""
    rank0 = reports[0]
    records = rank0["records"]
    seconds = max(r["interval_s"] for r in reports)
    rows = sum(r["rows"] for r in records)
    real = sum(r["real_tokens"] for r in records)
    padded = sum(r["padded_tokens"] for r in records)
    out = {"perf/samples_per_s": rows / seconds, "perf/real_tokens_per_s": real / seconds,
           "perf/padded_tokens_per_s": padded / seconds,
           "perf/padding_efficiency": real / padded if padded else 1.0}
    waits = []
    for rep in reports:
        r = rep["rank"]
        share = rep["input_wait_s"] / rep["interval_s"] if rep["interval_s"] else 0.0
        waits.append(share)
        out[f"worker{r}/input_wait_share"] = share
        out[f"worker{r}/samples_per_s"] = rep["local_rows"] / rep["interval_s"]
        out[f"worker{r}/real_tokens_per_s"] = rep["local_real_tokens"] / rep["interval_s"]
        if rep.get("max_memory_bytes"):
            out[f"worker{r}/max_memory_gb"] = rep["max_memory_bytes"] / 2**30
    out["perf/input_wait_share_mean"] = sum(waits) / len(waits)
    out["perf/input_wait_share_max"] = max(waits)
    return out


class MlflowCallback(ray.train.UserCallback):
    """Runs in the Ray Train controller: logs every report into the one MLflow run.

    Ray can re-deliver a report around a worker restart; steps at or below the last logged step
    are skipped, so the run's history never repeats or goes back.
    """

    def __init__(self, uri: str, run_id: str):
        self.uri, self.run_id = uri, run_id
        self.last_step: int | None = None
        self.last_print = 0.0
        self.started = time.time()

    def _resume_point(self) -> int:
        import mlflow

        history = mlflow.MlflowClient(self.uri).get_metric_history(self.run_id, "train/loss")
        return max((m.step for m in history), default=0)

    def after_report(self, run_context, metrics: list[dict], checkpoint) -> None:
        if self.last_step is None:
            self.last_step = self._resume_point()
        reports = sorted(metrics, key=lambda m: m["rank"])
        records = [r for r in reports[0]["records"] if r["step"] > self.last_step]
        if not records:
            return
        import mlflow
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for rec in records:
            for key in ("loss", "lr", "grad_norm"):
                batch.append(Metric(f"train/{key}", float(rec[key]), now, rec["step"]))
            batch.append(Metric("train/epoch", float(rec["epoch"]), now, rec["step"]))
        step = records[-1]["step"]
        scalars = interval_metrics(reports)
        scalars.update(reports[0].get("val", {}))
        batch += [Metric(k, float(v), now, step) for k, v in scalars.items()]
        client = mlflow.MlflowClient(self.uri)
        for i in range(0, len(batch), 500):
            client.log_batch(self.run_id, metrics=batch[i:i + 500])
        self.last_step = step
        self._progress(reports[0], records[-1], scalars)

    def _progress(self, rank0: dict, rec: dict, scalars: dict) -> None:
        now = time.time()
        total = rank0["steps_total"]
        if now - self.last_print < 10 and rec["step"] < total and "val/accuracy" not in scalars:
            return
        self.last_print = now
        done = rec["step"] / total
        eta = (now - self.started) * (1 - done) / max(done, 1e-9)
        val = f" | val acc {scalars['val/accuracy']:.4f}" if "val/accuracy" in scalars else ""
        print(f"[wellfed] step {rec['step']}/{total} | epoch {rec['epoch']} | loss {rec['loss']:.4f}"
              f" | {scalars['perf/samples_per_s']:.1f} samples/s"
              f" | {scalars['perf/real_tokens_per_s']:.0f} tok/s{val} | ETA {eta:.0f}s", flush=True)


def log_artifacts(uri: str, run_id: str, local_dir: str | Path, artifact_path: str) -> None:
    import mlflow

    mlflow.MlflowClient(uri).log_artifacts(run_id, str(local_dir), artifact_path)
