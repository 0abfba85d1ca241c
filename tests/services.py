"""Services a test starts on this machine: a free loopback port, and an `mlflow server`/`mlflow
ui` that is waited for and stopped, also when the test fails."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_served(command: str, args: list[str], cwd: Path, env: dict, patience: int):
    """`python -m mlflow <command> <args> --host 127.0.0.1 --port <free>` in its own process
    group; yields its base URL once /health answers (one try a second, `patience` tries), and
    stops only the processes it started."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", command, *args, "--host", "127.0.0.1", "--port", str(port)],
        cwd=cwd, env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **env,  # as `make ui`
                      "MLFLOW_DISABLE_TELEMETRY": "true"}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(patience):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5)
                break
            except OSError:
                assert proc.poll() is None, f"mlflow {command} exited"
                time.sleep(1)
        else:
            raise AssertionError(f"mlflow {command} did not answer on {base} in {patience} tries")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
