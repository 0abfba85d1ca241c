"""The driver side of every worker's reports: `MlflowCallback` puts them into the MLflow run,
`StoreCallback` registers and prunes the checkpoints they carry.

Both are plain classes with Ray Train's `after_report(run_context, metrics, checkpoint)`: the
in-process engine calls them directly, and on Ray Train `train/run/ray_callback.py` hands them to
the controller. Nothing here imports Ray (~1 s to import here, and absent on a box without it).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from pathlib import Path

from mlflow.entities import Metric

from wellfed import environ
from wellfed.track import run_details
from wellfed.track.tracking import send_metrics
from wellfed.track.worker_metrics import WORKERS, interval_metrics, worker_time_tag
from wellfed.train.checkpoints import retention

QUICK_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def quick_retries() -> None:
    """An unreachable tracking server must cost seconds per report, not MLflow's default
    minutes of exponential backoff (which would stall every worker at its next report)."""
    for key, value in QUICK_RETRIES.items():
        os.environ.setdefault(key, value)


def retries_restored():
    """In-process training sets the quick retries in the stage's own process (on Ray, in the
    controller's): afterwards the export, artifacts and model registry get MLflow's own
    timeouts back (a large model upload needs more than 5 s)."""
    return environ.scoped({}, keep=tuple(QUICK_RETRIES))


def flush_backlog(uri: str, run_id: str, path: str | Path) -> int:
    """Log what the callback could not (MLflow was down at the end of training); return count."""

    path = Path(path)
    if not path.is_file():
        return 0
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    send_metrics(uri, run_id, [Metric(k, v, t, s) for k, v, t, s in rows])
    path.unlink()
    return len(rows)


VAL_SHOWN = (("val/accuracy", "acc"), ("val/macro_f1", "macro-F1"), ("val/pearson", "pearson"))
"""The validation figure the progress line shows: the first of these the task has."""


class MlflowCallback:
    """Logs every report into the one MLflow run (in this process, or in the Ray Train
    controller).

    Ray can re-deliver a report around a worker restart, and a resume or a restart from step 0
    (every checkpoint damaged) redoes steps the run's history already holds: steps at or below
    the last logged step are shown but not logged again, so the history never repeats or goes
    back. The redone values are the logged ones: the same batches and random states, put back
    from the checkpoint (train/checkpoints/random_state.py).
    """

    def __init__(self, uri: str, run_id: str, backlog: str, background: bool = False):
        self.uri, self.run_id, self.backlog = uri, run_id, Path(backlog)
        self.last_step: int | None = None
        self.last_print = 0.0
        self.started = time.time()
        self.unsent: list[Metric] = []
        self.down_since: float | None = None
        self.redoing = False
        # In-process, the reports come from the training thread itself: a background sender
        # keeps MLflow's write (a sqlite commit, ~10-50 ms here) out of the steps; `drain`
        # waits for it where order matters (a checkpoint is registered after its steps).
        self.queue: queue.Queue | None = queue.Queue() if background else None
        self.sender: threading.Thread | None = None

    def __getstate__(self) -> dict:  # Ray sends it to the controller: no thread, no queue
        return {**self.__dict__, "queue": None, "sender": None}

    def drain(self) -> None:
        """Wait until every report handed over so far has been sent (or held back)."""
        if self.queue is not None:
            self.queue.join()

    def close(self) -> None:
        """Drain, then stop the background sender."""
        if self.sender is not None:
            self.queue.put(None)
            self.sender.join()
            self.sender = None

    def _sending(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                self._send(*item)
            finally:
                self.queue.task_done()
        self.queue.task_done()

    def _hand_over(self, batch: list[Metric], tags: dict[str, str]) -> None:
        if self.queue is None:
            self._send(batch, tags)
            return
        if self.sender is None:
            self.sender = threading.Thread(target=self._sending, name="wellfed-mlflow",
                                           daemon=True)
            self.sender.start()
        self.queue.put((batch, tags))

    def _resume_point(self, reports: list[dict]) -> int:
        import mlflow

        try:
            history = mlflow.MlflowClient(self.uri).get_metric_history(self.run_id, "train/loss")
            return max((m.step for m in history), default=0)
        except Exception:  # tracking server down: trust this report's steps
            return reports[0]["records"][0]["step"] - 1

    def _send(self, batch: list[Metric], tags: dict[str, str]) -> None:
        """Log `batch` (and anything held back) and `tags`; if MLflow is unreachable, warn once,
        keep the metrics in memory and in a backlog file, and retry at the next report (the
        tags are replaced by the next report's)."""

        self.unsent += batch
        try:
            send_metrics(self.uri, self.run_id, self.unsent, tags)
        except Exception as err:
            if self.down_since is None:
                self.down_since = time.time()
                print(f"[wellfed] WARNING: MLflow at {self.uri} unreachable ({type(err).__name__}); "
                      f"training continues, metrics are kept and retried (backlog: {self.backlog})",
                      flush=True)
            with open(self.backlog, "a", encoding="utf-8") as f:
                for m in batch:
                    f.write(json.dumps([m.key, m.value, m.timestamp, m.step]) + "\n")
            return
        if self.down_since is not None:
            print(f"[wellfed] MLflow reachable again: flushed {len(self.unsent)} held-back values",
                  flush=True)
            self.down_since = None
            self.backlog.unlink(missing_ok=True)
        self.unsent = []

    def after_report(self, run_context, metrics: list[dict], checkpoint) -> None:
        reports = sorted(metrics, key=lambda m: m["rank"])
        if self.last_step is None:
            quick_retries()
            self.last_step = self._resume_point(reports)
            try:
                self._log_worker_choices(reports)
            except Exception:
                pass  # params are logged again at the end of the stage
        scalars = interval_metrics(reports)
        scalars.update(reports[0].get("val", {}))
        records = [r for r in reports[0]["records"] if r["step"] > self.last_step]
        if records:
            self._log(reports, records, scalars)
        elif not self.redoing:  # shown, not logged again: the same seed and batches redo them
            self.redoing = True
            print(f"[wellfed] steps up to {self.last_step} are redone (a resume or restart from "
                  "an earlier checkpoint): shown, and kept in MLflow as first logged, once each",
                  flush=True)
        self._progress(reports[0], reports[0]["records"][-1], scalars)

    def _log(self, reports: list[dict], records: list[dict], scalars: dict) -> None:
        now = int(time.time() * 1000)
        batch = []
        for rec in records:
            for key in ("loss", "lr", "grad_norm"):
                batch.append(Metric(f"train/{key}", float(rec[key]), now, rec["step"]))
            batch.append(Metric("train/epoch", float(rec["epoch"]), now, rec["step"]))
            if rec.get("skipped"):  # fp16 overflow: the GradScaler skipped this step
                batch.append(Metric("train/skipped_step", 1.0, now, rec["step"]))
        step = records[-1]["step"]
        batch += [Metric(k, float(v), now, step) for k, v in scalars.items()]
        self._hand_over(batch, worker_time_tag(reports))
        self.last_step = step

    def _log_worker_choices(self, reports: list[dict]) -> None:
        """What the workers decided on their device: precision (and why), padding, device names,
        and every key of a report's `derived` dict, as `derived.*` values (not params: no one set
        them, so they stay out of the compare page's "params that differ"): the precision and
        the devices as run tags, the rest in the run's details (run_details.log_derived)."""
        rank0 = reports[0]
        tags = {"derived.precision": rank0["precision"],
                "derived.precision_reason": rank0["precision_reason"],
                "derived.pad_multiple": rank0["pad_multiple"],
                "derived.devices": ",".join(sorted({r["device"] for r in reports})),
                "derived.peak_flops": f"{rank0['peak_flops']:.4g}",
                "derived.peak_source": rank0["peak_source"],
                "derived.telemetry": rank0["sampler"],
                "derived.worker_nodes": len({r.get("node") for r in reports}),
                # The token budget at the first report (workers/micro_batch_tokens follows it).
                "derived.micro_batch_tokens": rank0.get("micro_batch_tokens", 0),
                "derived.micro_batch_tokens_source": rank0.get("micro_batch_tokens_source", ""),
                "derived.compiled": rank0.get("compiled", False),
                **{f"derived.{k}": v for k, v in rank0.get("derived", {}).items()}}
        run_details.log_derived(self.uri, self.run_id, tags)
        print(f"[wellfed] precision={rank0['precision']} ({rank0['precision_reason']}), "
              f"pad_multiple={rank0['pad_multiple']}, devices={tags['derived.devices']}, "
              f"peak {rank0['peak_flops'] / 1e12:.3g} TFLOP/s ({rank0['peak_source']})", flush=True)
        if rank0["sampler"] != "gpu":
            print("[wellfed] no GPU telemetry on this run (no CUDA device / NVML): recording "
                  "process CPU utilisation and memory instead", flush=True)

    def _progress(self, rank0: dict, rec: dict, scalars: dict) -> None:
        now = time.time()
        total = rank0["steps_total"]
        if now - self.last_print < 10 and rec["step"] < total and "val/loss" not in scalars:
            return
        self.last_print = now
        done = rec["step"] / total
        eta = (now - self.started) * (1 - done) / max(done, 1e-9)
        shown = [(k, name) for k, name in VAL_SHOWN if k in scalars][:1]
        val = "".join(f" | val {name} {scalars[k]:.4f}" for k, name in shown)
        print(f"[wellfed] step {rec['step']}/{total} | epoch {rec['epoch']} | loss {rec['loss']:.4f}"
              f" | {scalars[WORKERS + 'samples_per_s']:.1f} samples/s"
              f" | {scalars[WORKERS + 'real_tokens_per_s']:.0f} tok/s{val} | ETA {eta:.0f}s",
              flush=True)


class StoreCallback:
    """In the Ray Train controller, after the MlflowCallback: each checkpoint the store wrote and
    Ray registered is marked registered in the store (its steps are in MLflow now), then the run's
    checkpoints are pruned to train.keep_checkpoints (train/checkpoints/store.py). Ray itself keeps
    every one it registered (no `num_to_keep`): the store decides."""

    def __init__(self, store, keep: int | None, best: bool):
        self.store, self.keep, self.best = store, keep, best

    def after_report(self, run_context, metrics: list[dict], checkpoint) -> None:
        if checkpoint is not None:
            self.store.register(checkpoint.path)
            retention.prune(self.store, self.keep, self.best)
