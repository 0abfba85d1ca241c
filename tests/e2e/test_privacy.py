"""A `dvc repro` and `make ui` talk to no third party: every Python process (dvc, each stage, Ray's
dashboard and agents, the Ray Train controller and workers, the MLflow server) loads
tests/e2e/netguard, which refuses and records any connection or name lookup that would leave
this machine.

Ray's raylet and GCS are C++ and not seen by the guard; Ray's usage reports go through the head's
dashboard process (Python, guarded), and RAY_USAGE_STATS_ENABLED is what switches them off.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.e2e.pipeline import env, make_project
from tests.services import free_port
from wellfed import privacy

pytestmark = pytest.mark.e2e
GUARD = Path(__file__).parent / "netguard"
# MLflow stays silent when it believes it runs in CI or under pytest, so a run that kept these
# could never fail here: the pipeline gets the environment of a user's shell instead.
CI_MARKERS = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL",
              "BUILDKITE", "CIRCLECI", "TRAVIS", "TF_BUILD", "BITBUCKET_BUILD_NUMBER",
              "CODEBUILD_BUILD_ARN", "TEAMCITY_VERSION")
# Every Ray head start, the dashboard asks the cloud metadata service which cloud it is on (to
# fill a usage report it then does not send). No switch turns that off; the README says so.
RAY_CLOUD_PROBE = "get_cloud_from_metadata_requests"
OPTED_IN = {"DO_NOT_TRACK": "0", "MLFLOW_DISABLE_TELEMETRY": "false",
            "HF_HUB_DISABLE_TELEMETRY": "0", "RAY_USAGE_STATS_ENABLED": "1"}


def guarded_env(log: Path, **overrides: str) -> dict:
    """A user's shell after `source .venv/bin/activate`: no telemetry switch (the code must
    supply them), no HF_HUB_OFFLINE (the model is a local directory), and guarded."""
    out = {k: v for k, v in env().items()
           if k not in (*CI_MARKERS, *privacy.SWITCHES, "HF_HUB_OFFLINE")}
    local = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
             if a.family in (socket.AF_INET, socket.AF_INET6)}
    out.update(NETGUARD_LOG=str(log), NETGUARD_LOCAL=",".join(sorted(local)),
               PYTHONPATH=os.pathsep.join(filter(None, [str(GUARD), out.get("PYTHONPATH")])))
    out.update(overrides)
    return out


def pid(line: str) -> int:
    return int(line.split()[1].removeprefix("pid="))


def read_guard_log(log: Path) -> tuple[dict[int, str], list[str]]:
    """({pid: its last `load` line}, [refused lines]); Ray's setup_worker execs default_worker
    in the same process, which then loads the guard again."""
    lines = log.read_text(encoding="utf-8").splitlines()
    return ({pid(line): line for line in lines if line.startswith("load ")},
            [line for line in lines if line.startswith("refused ")])


def repro(project: Path, log: Path, *targets: str, **overrides: str) -> None:
    proc = subprocess.run(["dvc", "repro", *targets], cwd=project, capture_output=True, text=True,
                          timeout=900, env=guarded_env(log, **overrides))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def guarded_run(tmp_path_factory, tiny_model_dir):
    """The whole pipeline, 1 Ray worker (on Ray Train, not in-process: the guard must reach
    Ray's worker processes), under the guard; returns (project, guard log)."""
    dest = tmp_path_factory.mktemp("privacy")
    make_project(dest, {"model": {"name": str(tiny_model_dir), "init": "random"},
                        "train": {"epochs": 1, "global_batch_size": 16, "micro_batch_size": 16,
                                  "eval_every": 0, "report_every": 2, "checkpoint_every": 0},
                        "ray": {"num_workers": 1, "cpus_per_worker": 1, "in_process": False}},
                 raw_rows={"train.tsv": 64, "dev.tsv": 32, "test.tsv": 32})
    log = dest / "netguard.log"
    repro(dest, log)
    return dest, log


def test_the_guard_runs_in_every_process_of_the_pipeline(guarded_run):
    _, log = guarded_run
    loads, _ = read_guard_log(log)
    for process in ("bin/dvc", "stages/prepare.py", "stages/tokenize_text.py", "stages/train.py",
                    "stages/evaluate.py", "ray/dashboard/dashboard.py", "ray/dashboard/agent.py"):
        assert sum(process in line for line in loads.values()) == 1, process
    # Ray worker processes: at least the Ray Train controller and the one training worker.
    assert sum("workers/default_worker.py" in line for line in loads.values()) >= 2


def test_a_pipeline_run_attempts_no_connection_off_this_machine(guarded_run):
    _, log = guarded_run
    _, refused = read_guard_log(log)
    others = [line for line in refused if RAY_CLOUD_PROBE not in line]
    assert others == [], "\n".join(others)


def test_without_the_switches_the_guard_catches_mlflow_in_the_stage_and_in_a_ray_worker(
        guarded_run):
    """The train stage again with every switch set to 'send': MLflow's telemetry client reaches
    for its config from the driver and from the Ray Train controller (a Ray worker process), and
    the guard records both. The tests above would fail this way if the switches went missing."""
    project, _ = guarded_run
    log = project / "netguard-opted-in.log"
    repro(project, log, "--force", "--single-item", "train", **OPTED_IN)
    loads, refused = read_guard_log(log)
    callers = [loads[pid(line)] for line in refused if "mlflow-telemetry.io" in line]
    assert any("stages/train.py" in caller for caller in callers), refused
    assert any("workers/default_worker.py" in caller for caller in callers), refused


@pytest.mark.parametrize("report_url", [True, False], ids=["switches", "no-report-url"])
def test_a_ray_start_head_posts_nothing(tmp_path, report_url):
    """The SLURM script's `ray start --head` with privacy's switches: the dashboard's one
    "usage stats disabled" notice is aimed at loopback, so only the cloud probe is seen.
    Without RAY_USAGE_STATS_REPORT_URL the guard catches that notice going to usage-stats.ray.io."""
    log = tmp_path / "netguard.log"
    switches: dict[str, str] = {}
    privacy.apply(switches)
    if not report_url:
        del switches["RAY_USAGE_STATS_REPORT_URL"]
    port = free_port()
    ray_tmp = Path(tempfile.mkdtemp(prefix="wf-ray-"))  # short: Ray's socket paths live under it
    head = subprocess.Popen(["ray", "start", "--head", "--node-ip-address", "127.0.0.1",
                             f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                             f"--temp-dir={ray_tmp}", "--block"], cwd=tmp_path,
                            env=guarded_env(log, **switches,  # no 30 s drain on SIGTERM
                                            RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0"),
                            start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The dashboard logs this, then posts its notice at once (or would, with stats off).
        deadline = time.time() + 180
        while not any("Usage reporting is disabled" in path.read_text()
                      for path in ray_tmp.glob("session_*/logs/dashboard.log")):
            assert head.poll() is None and time.time() < deadline, "no Ray dashboard came up"
            time.sleep(0.5)
        time.sleep(5)
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # only the processes this test started
        head.wait(timeout=60)
        current = Path("/tmp/ray/ray_current_cluster")  # a stale record misleads later Ray runs
        if current.is_file() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    _, refused = read_guard_log(log)
    others = [line for line in refused if RAY_CLOUD_PROBE not in line]
    if report_url:
        assert others == [], "\n".join(others)
    else:
        assert len(others) == 1 and "'usage-stats.ray.io'" in others[0], others


def test_make_ui_server_fetches_nothing_and_tells_the_browser_to_send_nothing(tmp_path):
    """`make ui` runs `mlflow ui` with the Makefile's switches (tests/test_privacy.py checks the
    Makefile sets exactly privacy.SWITCHES; one server worker here instead of 4, to start
    faster): no telemetry config fetch at start-up, none from the CDN when the page asks, the
    browser is told telemetry is off and what it posts anyway is dropped."""
    log = tmp_path / "netguard.log"
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri",
         f"sqlite:///{tmp_path / 'mlflow.db'}", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        cwd=tmp_path, env=guarded_env(log, **privacy.SWITCHES), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300  # first start creates the database
        while True:
            try:
                page = urllib.request.urlopen(f"{base}/", timeout=5).read().decode()
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, "mlflow ui did not start"
                time.sleep(1)
        config = json.load(urllib.request.urlopen(f"{base}/ajax-api/3.0/mlflow/ui-telemetry"))
        posted = urllib.request.Request(
            f"{base}/ajax-api/3.0/mlflow/ui-telemetry", method="POST",
            headers={"Content-Type": "application/json"},
            data=json.dumps({"records": [{"event_name": "x", "timestamp_ns": 1, "params": {},
                                          "installation_id": "i", "session_id": "s"}]}).encode())
        answer = json.load(urllib.request.urlopen(posted))
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # only the processes this test started
        server.wait(timeout=60)
    assert "<title>MLflow</title>" in page and "https://" not in page  # page assets: same origin
    assert config["disable_ui_telemetry"] is True
    assert answer == {"status": "disabled"}
    loads, refused = read_guard_log(log)
    assert len(loads) >= 2 and refused == []  # the CLI and its server worker were guarded
