"""What MLflow's server job runner costs a store that never runs a job: `mlflow server` with
MLFLOW_SERVER_ENABLE_JOB_EXECUTION true (MLflow's default) against false (what the team store and
`make ui` set, scripts/team_store.py JOBS).

MLflow 3's server starts a job runner beside its workers: a process per job kind (GenAI scorers,
prompt optimisation and the like) plus a periodic-tasks consumer. wellfed logs no such job. Each
side starts plain `mlflow server` (2 workers, a sqlite backend so that PostgreSQL's own start is
not in the figure, no logins), waits for /health, lets it idle SETTLE_S seconds, then counts its
process tree: processes, CPU seconds (user + system) and resident memory. The sides alternate
A B A B, ROUNDS times (this 2-core machine is shared and drifts).

    python benchmarks/server_jobs.py            # -> benchmarks/results/server_jobs.json
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import machine, write_result  # noqa: E402
from tests.services import free_port  # noqa: E402

ROUNDS = 3
SETTLE_S = 30
"""Seconds the started server idles before it is counted: its job runner's consumers start after
/health answers."""
WORKERS = 2


def one(jobs: str) -> dict:
    """Start a server with job execution `jobs` ("true"/"false"), count its tree, stop it."""
    folder, port = tempfile.mkdtemp(prefix="server-jobs-"), free_port()
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{folder}/mlflow.db", "--host", "127.0.0.1", "--port", str(port),
         "--workers", str(WORKERS)],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": jobs,
             "MLFLOW_DISABLE_TELEMETRY": "true"},
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited ({proc.returncode})")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.3)
        health = time.time() - started
        time.sleep(SETTLE_S)
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
        cpu = sum(sum(p.cpu_times()[:2]) for p in tree)
        rss = sum(p.memory_info().rss for p in tree)
        return {"health_s": round(health, 1), "processes": len(tree), "cpu_s": round(cpu, 1),
                "rss_mb": round(rss / 2**20)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def main() -> None:
    runs: dict[str, list[dict]] = {"true": [], "false": []}
    for round_ in range(ROUNDS):
        for jobs in ("true", "false"):
            runs[jobs].append(one(jobs))
            print(f"[bench] round {round_ + 1}/{ROUNDS} jobs={jobs}: {runs[jobs][-1]}", flush=True)
    median = {jobs: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
              for jobs, rows in runs.items()}
    on, off = median["true"], median["false"]
    write_result("server_jobs", {
        "machine": machine(), "mlflow": __import__("mlflow").__version__, "rounds": ROUNDS,
        "settle_s": SETTLE_S, "workers": WORKERS, "runs": runs, "median": median,
        "ratio_on_over_off": {key: round(on[key] / off[key], 2) for key in on if off[key]}})


if __name__ == "__main__":
    main()
