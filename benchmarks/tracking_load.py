"""Where sqlite stops being enough: N trials reporting at once into the project's sqlite store
and into the team store (an MLflow server on PostgreSQL, scripts/team_store.py).

Each reporter is what a trial's driver runs: `MlflowCallback.after_report`
(train/outputs/callback.py) fed a worker's report as the loop builds it (`WorkerReport.as_dict`: 10
steps of loss, lr, grad norm and epoch, the interval figures: 54 metric values, one MLflow batch),
one report every `PACE_S` seconds, `REPORTS` times, then the driver's end-of-training flush of
anything held back. N = 4, 16, 64 reporters run as up to `PROCESSES` processes of N / PROCESSES
threads each (64 processes importing MLflow would measure the imports on 2 cores, not the store).

Per backend and N: the latency of a report (p50, p99: `after_report`'s own time, the write
included), the reports that failed at first (held back in the backlog, retried at the next
report), how many of those failures said "database is locked", and the metric rows lost: rows
expected minus rows in the store after the flush (must be 0 on the server).

    python benchmarks/tracking_load.py            # -> benchmarks/results/tracking_load.json
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from harness import machine, write_result  # noqa: E402

SIZES = (4, 16, 64)
REPORTS = 20
"""Reports per reporter: 200 steps at report_every 10."""
PACE_S = 0.5
"""Seconds between a reporter's reports: 10 steps of a small model on a GPU, or of the tiny
test model on a CPU; a MiniLM step on this CPU is ~0.3 s, so reports 3 s apart there."""
PROCESSES = 8
START_S = 60.0
"""The reporters start together this long after their processes: 8 processes import MLflow
and open their store in ~20-40 s on this loaded 2-core machine."""
STEPS_PER_REPORT = 10
KEYS_PER_STEP = 4  # train/loss, train/lr, train/grad_norm, train/epoch


def report(rank_step: int, steps_total: int) -> dict:
    """A worker's report as the loop builds it, for the steps up to `rank_step`."""
    from wellfed.train.step.worker_report import WorkerFacts, WorkerReport

    facts = WorkerFacts(rank=0, steps_total=steps_total, precision="fp32",
                        precision_reason="bench", pad_multiple=1, device="cpu", node="n",
                        peak_flops=1e11, peak_source="bench")
    records = [{"step": s, "epoch": 0, "lr": 1e-4, "loss": 1.0 / s, "grad_norm": 0.5,
                "skipped": False, "rows": 32, "real_tokens": 400, "padded_tokens": 420}
               for s in range(rank_step - STEPS_PER_REPORT + 1, rank_step + 1)]
    interval = {"interval_s": PACE_S, "input_wait_s": 0.01, "copy_s": 0.0, "compute_s": 0.49,
                "input_wait_share": 0.02, "local_rows": 320, "local_real_tokens": 4000,
                "local_padded_tokens": 4200, "mfu": 0.3}
    return WorkerReport(facts, {}, records, interval, {"cpu_util_pct": 90.0, "cpu_rss_gb": 1.0},
                        "cpu", {"steps": PACE_S}).as_dict()


def reporter(uri: str, run_id: str, backlog: str, start: float, out: list) -> None:
    """One trial's driver side: REPORTS reports, PACE_S apart from `start` on, then the
    end-of-training flush."""
    import mlflow

    from wellfed.track import tracking
    from wellfed.train.outputs import callback

    # A trial's driver opened its run (and so its store: sqlite's engine, the server's
    # connection) long before its first report; so does this one, untimed.
    mlflow.MlflowClient(uri).get_run(run_id)

    errors: list[str] = []
    real_send = tracking.send_metrics

    def counted(*args, **kwargs):
        try:
            return real_send(*args, **kwargs)
        except Exception as err:
            errors.append(str(err))
            raise

    callback.send_metrics = counted  # the callback's own name for it: count, then fail as before
    cb = callback.MlflowCallback(uri, run_id, backlog)
    cb.last_step = 0  # a fresh run: no history to look up first
    total = REPORTS * STEPS_PER_REPORT
    latencies = []
    late = time.time() > start  # its process was not ready in time: the overlap is smaller
    time.sleep(max(start - time.time(), 0))  # every reporter starts at once
    for i in range(1, REPORTS + 1):
        started = time.perf_counter()
        cb.after_report(None, [report(i * STEPS_PER_REPORT, total)], None)
        latencies.append(time.perf_counter() - started)
        time.sleep(max(PACE_S - latencies[-1], 0))
    flush_error = ""
    try:
        callback.flush_backlog(uri, run_id, backlog)
    except Exception as err:  # what the stage would say: training done, metrics still waiting
        flush_error = str(err)[:200]
    out.append({"latencies": latencies, "errors": errors, "flush_error": flush_error,
                "late": late})


def process(uri: str, runs: list[str], folder: str, start: float, queue) -> None:
    import contextlib
    import io

    out: list = []
    with contextlib.redirect_stdout(io.StringIO()):  # the callback's progress lines
        threads = [threading.Thread(target=reporter, args=(
            uri, run_id, f"{folder}/{run_id}.jsonl", start, out)) for run_id in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    queue.put(out)


def measure(uri: str, n: int, folder: Path) -> dict:
    import mlflow

    from wellfed.track import tracking

    experiment = f"load-{n}-{time.time_ns()}"
    runs = [tracking.start_run(uri, experiment, f"trial-{i}") for i in range(n)]
    groups = [runs[i::min(n, PROCESSES)] for i in range(min(n, PROCESSES))]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    started = time.time()
    start = started + START_S  # after every process has imported MLflow and opened its runs
    procs = [ctx.Process(target=process, args=(uri, group, str(folder), start, queue))
             for group in groups]
    for p in procs:
        p.start()
    results = [r for _ in procs for r in queue.get()]
    for p in procs:
        p.join()
    wall = time.time() - start
    client = mlflow.MlflowClient(uri)
    stored = sum(len(client.get_metric_history(run_id, key)) for run_id in runs
                 for key in ("train/loss", "train/lr", "train/grad_norm", "train/epoch"))
    expected = n * REPORTS * STEPS_PER_REPORT * KEYS_PER_STEP
    latencies = sorted(x for r in results for x in r["latencies"])
    errors = [e for r in results for e in r["errors"]]
    late = sum(r["late"] for r in results)
    return {"reporters": n, "reports": len(latencies), "wall_s": round(wall, 1),
            "reporters_started_late": late,
            "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
            "reports_failed_at_first": len(errors),
            "database_is_locked": sum("database is locked" in e for e in errors),
            "step_rows_expected": expected, "step_rows_stored": stored,
            "step_rows_lost": expected - stored,
            "flush_errors": sum(bool(r["flush_error"]) for r in results),
            "first_error": errors[0][:300] if errors else ""}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.e2e.teamstore import team_store  # PostgreSQL + MLflow server: make team-store

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    facts = machine()
    cases = []
    with tempfile.TemporaryDirectory() as tmp, team_store(workers=4) as store:
        for n in SIZES:
            for backend, uri in (("sqlite", f"sqlite:///{tmp}/mlflow-{n}.db"),
                                 ("server+postgresql", store.uri)):
                folder = Path(tmp) / f"{backend}-{n}"
                folder.mkdir()
                row = {"backend": backend, **measure(uri, n, folder)}
                print(json.dumps(row))
                cases.append(row)
    write_result("tracking_load", {
        "what": (f"N trial reporters (MlflowCallback.after_report with a worker's report: "
                 f"{STEPS_PER_REPORT} steps, 54 metric values) each sending {REPORTS} reports "
                 f"{PACE_S} s apart, then the end-of-training flush; sqlite = the project's "
                 "default store, server+postgresql = scripts/team_store.py (4 server workers); "
                 f"up to {PROCESSES} processes x N/{PROCESSES} threads"),
        "machine": facts, "cases": cases})


if __name__ == "__main__":
    main()
