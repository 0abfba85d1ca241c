"""`make ui` starts MLflow's server without Starlette's deprecation warning (MLflow's own import
of starlette.middleware.wsgi, once per server worker): the Makefile's filter silences it, and
only it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]


def ui_filter() -> str:
    found = re.findall(r"^UI_WARNINGS = (.+)$", (PROJECT / "Makefile").read_text(), re.M)
    assert len(found) == 1, "the Makefile's ui target names no warning filter (UI_WARNINGS)"
    return found[0]


@pytest.mark.integration
def test_the_ui_servers_import_says_no_starlette_deprecation():
    env = {**os.environ, "PYTHONWARNINGS": ui_filter(), "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.run([sys.executable, "-c", "import mlflow.server.fastapi_app; "
                           "import warnings; warnings.warn('other warnings still show')"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "StarletteDeprecationWarning" not in proc.stderr, proc.stderr[-2000:]
    assert "other warnings still show" in proc.stderr
