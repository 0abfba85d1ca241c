"""Telemetry off: a pipeline run reports nothing to any library's vendor unless the user asks.

`SWITCHES` is the one list. `apply()` puts each switch into this process's environment unless the
user has set that variable (to any value: that is how to opt back in), so every child inherits
it, Ray's GCS, raylet and dashboard included; the driver also hands the switches to the Ray
workers through the runtime environment (`worker_env`), which is what reaches workers on nodes
started with `ray start`. The Makefile and scripts/slurm/wellfed.sbatch export the same values for
the processes no stage starts (`dvc`, `mlflow ui`, `ray start`); tests/test_privacy.py keeps the
three in step.

What each switch stops, and when its library reads it (checked in the installed sources):
- MLflow 3.x: `import mlflow` starts a telemetry client that fetches its config from
  config.mlflow-telemetry.io and posts usage events; `mlflow ui` also fetches the UI's telemetry
  config from a CDN and forwards the browser's events. MLFLOW_DISABLE_TELEMETRY (true/false/1/0)
  turns all of it off, and the UI is told to send nothing. MLflow honours DO_NOT_TRACK only when
  it is "true", so the usual DO_NOT_TRACK=1 alone does not reach it. Read at import.
- Ray: a cluster head's dashboard process posts usage stats to usage-stats.ray.io.
  RAY_USAGE_STATS_ENABLED must be exactly "0" or "1" (anything else raises); `ray.init` on a
  release wheel sets 0 itself for the local cluster it starts, `ray start` reads it when the head
  starts. Even with 0, a `ray start` head posts one "disabled" notice to the same address, so
  RAY_USAGE_STATS_REPORT_URL (Ray's own variable, meant for its tests) points at a closed port on
  loopback while usage stats are off. Not switchable: on every head start the dashboard asks the
  cloud metadata service (169.254.169.254, metadata.google.internal) which cloud it is on.
- Hugging Face Hub: HF_HUB_DISABLE_TELEMETRY (or DO_NOT_TRACK) in 1/ON/YES/TRUE, read at
  `import huggingface_hub`: no library/version details in the user agent of Hub requests and no
  `send_telemetry` pings. Whether the Hub is contacted at all is HF_HUB_OFFLINE (Makefile: 1).
- DO_NOT_TRACK=1: the cross-tool convention (https://donottrack.sh) for any library that joins.
DVC's analytics are off in the repository's .dvc/config (`core.analytics = false`), which DVC
reads when a `dvc` command ends; the update check runs only for `dvc version`.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SWITCHES = {
    "DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}
# Port 9 (discard) on loopback: refused at once, nothing leaves the machine.
RAY_REPORT_URL = "http://127.0.0.1:9/"


def apply(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set every switch the user has not set.

    Call it before importing mlflow, ray or huggingface_hub: they read their switch at import.
    """
    for name, value in SWITCHES.items():
        environ.setdefault(name, value)
    if environ["RAY_USAGE_STATS_ENABLED"] == "0":
        environ.setdefault("RAY_USAGE_STATS_REPORT_URL", RAY_REPORT_URL)


def worker_env(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """The switches as this process has them (defaults where unset), for Ray's `env_vars`."""
    return {name: environ.get(name, value) for name, value in SWITCHES.items()}
