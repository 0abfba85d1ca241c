"""What every worker's reports of one interval become as run figures: global throughput, each
worker figure's mean over workers (and, with more than one worker, each worker's own and their
spread, where a straggler shows), the loop's time breakdown as one tag, and the throughput curve
data/train/history/perf.csv repeats. The driver's callback (train/outputs/callback.py) logs them
through track/tracking.py.
"""

from __future__ import annotations

import time

WORKERS = "workers/"
"""The throughput family, per report interval: all workers' rows and tokens per second, padding
efficiency, and each worker figure's mean over workers. Its name sorts after `eval/`, `train/`
and `val/`, so the headline comes first in the UI's metric lists and charts (alphabetical)."""


def spread(out: dict, name: str, values: list[float]) -> None:
    """Cross-worker aggregates of one figure."""
    out[f"{name}_min"], out[f"{name}_max"] = min(values), max(values)
    out[f"{name}_mean"] = sum(values) / len(values)


def interval_metrics(reports: list[dict]) -> dict[str, float]:
    """One report interval from all workers' reports: global throughput and the mean over
    workers of each worker's figures; with more than one worker also every worker's own figures
    (`worker<rank>/...`) and their min and max, where a straggler shows. One worker's figures
    are the means, so a single-worker run has no per-worker keys (its metric count stays small
    and does not grow with anything)."""
    records = reports[0]["records"]
    seconds = max(r["interval_s"] for r in reports)
    rows = sum(r["rows"] for r in records)
    real = sum(r["real_tokens"] for r in records)
    padded = sum(r["padded_tokens"] for r in records)
    out = {f"{WORKERS}samples_per_s": rows / seconds, f"{WORKERS}real_tokens_per_s": real / seconds,
           f"{WORKERS}padding_efficiency": real / padded if padded else 1.0}
    per_worker: dict[str, list[float]] = {}
    for rep in reports:
        secs = rep["interval_s"] or 1e-9
        figures = {"input_wait_share": rep["input_wait_s"] / secs,
                   "copy_share": rep["copy_s"] / secs, "compute_share": rep["compute_s"] / secs,
                   "mfu": rep["mfu"], **rep.get("telemetry", {})}
        if len(reports) > 1:  # each worker's own figures: where a straggler shows
            figures.update(samples_per_s=rep["local_rows"] / secs,
                           real_tokens_per_s=rep["local_real_tokens"] / secs)
            out.update({f"worker{rep['rank']}/{key}": value for key, value in figures.items()})
        for key, value in figures.items():
            per_worker.setdefault(key, []).append(value)
    for key, values in per_worker.items():
        if len(values) < len(reports):  # a figure some workers lack (a node without a GPU)
            continue
        if len(reports) > 1:
            spread(out, f"{WORKERS}{key}", values)
        else:
            out[f"{WORKERS}{key}_mean"] = values[0]
    if reports[0].get("micro_batch_tokens"):  # a token budget, halved after a CUDA OOM: visible
        out[f"{WORKERS}micro_batch_tokens"] = reports[0]["micro_batch_tokens"]
    if reports[0].get("graphs_captured"):  # the CUDA graph step (train/step/graphs.py): so far
        out[f"{WORKERS}graphs_captured"] = reports[0]["graphs_captured"]
        out[f"{WORKERS}graph_capture_s"] = reports[0]["graph_capture_s"]
    return out


def worker_time_tag(reports: list[dict]) -> dict[str, str]:
    """Rank 0's seconds so far per part of the loop (setup, steps, validation, checkpoints,
    reports; it also writes the checkpoints) as one run tag, overwritten at every report: the
    stage's time breakdown reads the last one (telemetry/phases.py), so they need no metric
    keys of their own."""
    import json

    timing = reports[0].get("timing")
    if not timing:
        return {}
    return {WORKER_TIME: json.dumps({"at": time.time(), "seconds": timing})}


WORKER_TIME = "wellfed.worker_time"


# The run's throughput curve, one row per report interval: the driver's interval metrics (global
# rows and tokens over the slowest worker's interval; input wait and MFU as means over workers).
# MLflow logs them and data/train/history/perf.csv repeats them under the same names.
PERF_CURVE = tuple(f"{WORKERS}{k}" for k in ("samples_per_s", "real_tokens_per_s",
                                              "padding_efficiency", "input_wait_share_mean",
                                              "mfu_mean"))
