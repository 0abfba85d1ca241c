"""The driver-side callback against a real MLflow server that goes away mid-run and comes back."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services import free_port

from wellfed.track import tracking
from wellfed.train.outputs.callback import MlflowCallback

pytestmark = pytest.mark.e2e


def start_server(db: Path, port: int) -> subprocess.Popen:
    mlflow = str(Path(sys.executable).parent / "mlflow")
    proc = subprocess.Popen([mlflow, "server", "--backend-store-uri", f"sqlite:///{db}",
                             "--default-artifact-root", str(db.parent / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True,  # no job runner, as `make ui`
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    deadline = time.time() + 90
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.3)
    raise AssertionError("mlflow server did not start")


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)


def report(first: int, last: int) -> list[dict]:
    records = [{"step": s, "epoch": 0, "lr": 1e-4, "loss": 1.0 / s, "grad_norm": 1.0, "rows": 8,
                "real_tokens": 80, "padded_tokens": 96} for s in range(first, last + 1)]
    return [{"rank": 0, "records": records, "steps_total": 20, "interval_s": 1.0,
             "input_wait_s": 0.01, "copy_s": 0.0, "compute_s": 0.99, "local_rows": 8,
             "local_real_tokens": 80, "mfu": 0.1, "telemetry": {}, "sampler": "cpu",
             "precision": "fp32", "precision_reason": "test", "pad_multiple": 1, "device": "cpu",
             "node": "n0", "peak_flops": 1e12, "peak_source": "test"}]


def test_metrics_survive_a_tracking_server_outage(tmp_path, capsys):
    port, db = free_port(), tmp_path / "mlflow.db"
    uri = f"http://127.0.0.1:{port}"
    server = start_server(db, port)
    try:
        run_id = tracking.start_run(uri, "outage", "r")
        backlog = tmp_path / "backlog.jsonl"
        callback = MlflowCallback(uri, run_id, str(backlog))
        callback.after_report(None, report(1, 5), None)
        stop_server(server)
        started = time.time()
        callback.after_report(None, report(6, 10), None)  # server down: training must go on
        callback.after_report(None, report(11, 15), None)
        assert time.time() - started < 60  # seconds, not MLflow's minutes of backoff
        assert backlog.is_file()
        server = start_server(db, port)
        callback.after_report(None, report(16, 20), None)
    finally:
        stop_server(server)
    out = capsys.readouterr().out
    assert out.count("WARNING: MLflow at") == 1  # warned once, not per report
    assert "MLflow reachable again: flushed" in out and not backlog.exists()
    import mlflow

    server = start_server(db, port)
    try:
        steps = [m.step for m in mlflow.MlflowClient(uri).get_metric_history(run_id, "train/loss")]
    finally:
        stop_server(server)
    assert sorted(steps) == list(range(1, 21))  # every step exactly once


def test_in_process_reports_are_sent_in_the_background_in_order(tmp_path, monkeypatch):
    """The training thread hands a report over and goes on while MLflow writes it; `drain`
    waits for what was handed over (a checkpoint is registered after its steps are logged),
    and every step arrives once, in order."""
    import threading

    import wellfed.train.outputs.callback as callback_module

    sent, gate = [], threading.Event()

    def slow_send(uri, run_id, metrics, tags=None):
        gate.wait(30)
        sent.append(sorted({m.step for m in metrics if m.key == "train/loss"}))

    monkeypatch.setattr(callback_module, "send_metrics", slow_send)
    callback = MlflowCallback("sqlite:///unused", "run", str(tmp_path / "backlog"),
                              background=True)
    callback.last_step = 0  # as after _resume_point on a fresh run
    callback._log_worker_choices = lambda reports: None
    for first in (1, 6, 11):
        callback.after_report(None, report(first, first + 4), None)
    assert sent == []  # all three handed over while the first is still being written
    gate.set()
    callback.drain()
    assert sent == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
    callback.after_report(None, report(16, 20), None)
    callback.close()
    assert sent[-1] == [16, 17, 18, 19, 20] and callback.sender is None
