"""Telemetry switches: one list, set where every process gets them, understood by each library."""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import PROJECT
from wellfed import privacy
from wellfed.cli import stage
from wellfed.config import RayConfig

GUARD = PROJECT / "tests" / "e2e" / "netguard"


def test_apply_fills_in_only_what_the_user_left_unset():
    environ = {"MLFLOW_DISABLE_TELEMETRY": "false"}  # this user opts back in to MLflow's
    privacy.apply(environ)
    assert environ == {**privacy.SWITCHES, "MLFLOW_DISABLE_TELEMETRY": "false",
                       "RAY_USAGE_STATS_REPORT_URL": privacy.RAY_REPORT_URL}
    opted_in = {"RAY_USAGE_STATS_ENABLED": "1"}
    privacy.apply(opted_in)
    assert "RAY_USAGE_STATS_REPORT_URL" not in opted_in  # Ray's reports go where Ray sends them


def test_the_stage_wrapper_applies_the_switches_before_main(monkeypatch):
    for name in [*privacy.SWITCHES, "RAY_USAGE_STATS_REPORT_URL"]:
        monkeypatch.setenv(name, "")  # recorded, so whatever the stage sets is undone afterwards
        monkeypatch.delenv(name)
    seen = {}

    @stage
    def main(out):
        seen.update({name: os.environ.get(name) for name in privacy.SWITCHES})

    monkeypatch.setattr(sys, "argv", ["stage.py", "out"])
    main()
    assert seen == privacy.SWITCHES


@pytest.mark.parametrize("address", ["", "10.1.2.3:6379"], ids=["local", "cluster"])
def test_ray_workers_get_the_switches_in_their_runtime_env(monkeypatch, address):
    """Local workers inherit the driver's environment anyway; workers on `ray start` nodes get
    only the runtime environment, so the switches must be in it, with the user's values."""
    import ray

    from wellfed import cluster

    calls = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {})
    monkeypatch.setattr(ray, "nodes", lambda: [])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for name in privacy.SWITCHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "0")  # a user who opted in keeps it
    cluster.connect(RayConfig(address=address))
    assert len(calls) == 1
    env_vars = calls[0]["runtime_env"]["env_vars"]
    assert {k: env_vars[k] for k in privacy.SWITCHES} == {**privacy.SWITCHES,
                                                          "HF_HUB_DISABLE_TELEMETRY": "0"}


def test_makefile_and_slurm_script_set_the_same_switches():
    makefile = (PROJECT / "Makefile").read_text()
    exported = dict(re.findall(r"^export (\w+) \?= (\S+)$", makefile, re.M))
    assert {k: exported.get(k) for k in privacy.SWITCHES} == privacy.SWITCHES
    sbatch = (PROJECT / "scripts" / "slurm" / "wellfed.sbatch").read_text()
    defaults = dict(re.findall(r"^\s*export (\w+)=\$\{\1:-(\S+)\}$", sbatch, re.M))
    assert {k: defaults.get(k) for k in privacy.SWITCHES} == privacy.SWITCHES
    assert defaults["RAY_USAGE_STATS_REPORT_URL"] == privacy.RAY_REPORT_URL
    assert "--disable-usage-stats" not in sbatch  # it would overrule a user who opts in


def test_dvc_analytics_are_off_in_the_repository_config():
    config = configparser.ConfigParser()
    config.read(PROJECT / ".dvc" / "config")
    assert config["core"]["analytics"] == "false"


LIBRARIES_SAY = """
import json
from mlflow.telemetry.utils import is_telemetry_disabled
from huggingface_hub import constants
from ray._common.usage import usage_lib
print(json.dumps({"mlflow": is_telemetry_disabled(), "hub": constants.HF_HUB_DISABLE_TELEMETRY,
                  "ray": not usage_lib.usage_stats_enabled()}))
"""


@pytest.mark.parametrize("switches, off", [
    (privacy.SWITCHES, {"mlflow": True, "hub": True, "ray": True}),
    ({}, {"mlflow": False, "hub": False, "ray": False}),
    ({"DO_NOT_TRACK": "1"}, {"mlflow": False, "hub": True, "ray": False}),
], ids=["switches", "none", "do-not-track-alone"])
@pytest.mark.integration
def test_each_library_reads_its_switch_as_off(tmp_path, switches, off):
    """Each library's own check, in a clean process (no CI markers, which MLflow treats as
    off; a fresh HOME, so no ~/.ray/config.json): on without the switches, off with them.
    DO_NOT_TRACK=1 alone silences the Hub but not MLflow (it wants "true") nor Ray."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **switches}
    out = subprocess.run([sys.executable, "-c", LIBRARIES_SAY], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == off


def test_the_guard_refuses_and_records_a_planted_connection(tmp_path):
    """tests/e2e/netguard on PYTHONPATH: loopback passes; an outside address, an outside name and
    a plain HTTP request are refused before anything leaves, and each is logged."""
    log = tmp_path / "netguard.log"
    probe = """
import socket, urllib.request
server = socket.create_server(("127.0.0.1", 0))
socket.create_connection(server.getsockname(), timeout=5).close()
for attempt in (lambda: socket.create_connection(("192.0.2.1", 9), timeout=5),
                lambda: socket.getaddrinfo("example.com", 443),
                lambda: urllib.request.urlopen("https://usage-stats.ray.io/", timeout=5)):
    try:
        attempt()
    except OSError:
        print("refused")
"""
    env = {**os.environ, "NETGUARD_LOG": str(log), "PYTHONPATH": str(GUARD)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=600, check=True)
    assert out.stdout.split() == ["refused"] * 3
    lines = log.read_text().splitlines()
    assert len(lines) == 4 and lines[0].startswith("load pid=")
    assert ["192.0.2.1", "example.com", "usage-stats.ray.io"] == [
        re.search(r"refused pid=\d+ \w+ \(?'([^']+)'", line).group(1) for line in lines[1:]]
