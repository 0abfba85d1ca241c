"""The run's details: what a run records that nobody filters, searches or groups runs by, in one
JSON artifact, `run_details.json`, instead of ~20 tags.

MLflow's run page shows every tag as a chip above the run's description; a single-worker run
had 28 of them (MLflow hides its own `mlflow.*`), most of them sentences or numbers read once:
the newcomer met them before the headline. A run keeps as tags what the runs table filters and
groups by (SEARCHED below, `wellfed.run_key`, `git.dirty`, the sweep's, search's and alias' own);
the rest is here, in sections, and the run's description (track/run_note.py) reads from it:

    {"derived": {"accumulation_steps": 1, "precision_reason": "auto: CPU, ...", ...},
     "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", ...},
     "run_hash": "28b8e9...", "tokens_sha256": "...", "calibration": "temperature 1.03 ...",
     "diagnosis": "Bottleneck: ...", "worker_seconds": {"setup": 4.0, "steps": 56.9, ...},
     "pipeline_time": "pipeline 153.3 s since dvc started: ..."}

Not params: MLflow params are the user's knobs (the compare page's "params that differ") and
can never change, while a resume on fewer workers changes what was decided. Each write reads the
artifact, merges its section and writes it whole; the writers follow one another (the train
stage's start, its first report, its end, then evaluate), never at once.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from wellfed import environ
from wellfed.track import tracking
from wellfed.track.provenance import redact

ARTIFACT = "run_details.json"

SEARCHED = ("derived.precision", "derived.world_size", "derived.world_sizes", "derived.engine",
            "derived.devices", "derived.placement")
"""The decided values that stay run tags: what people filter, group and compare runs by (the
precision, the worker count and its changes, the engine, the hardware, the node a placed trial
ran on), and what a resume reads back (`derived.world_size(s)`, train/run/mlflow_run.py)."""


def read(uri: str, run_id: str) -> dict:
    """The run's details; {} for a run that has none (made before they existed)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    if not any(f.path == ARTIFACT for f in client.list_artifacts(run_id)):
        return {}
    # MLflow draws a progress bar for every download: one small file, on a console for people
    with tempfile.TemporaryDirectory() as folder, \
            environ.scoped({"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}):
        path = client.download_artifacts(run_id, ARTIFACT, folder)
        return json.loads(Path(path).read_text(encoding="utf-8"))


def update(uri: str, run_id: str, values: dict[str, Any]) -> dict:
    """Merge `values` into the run's details (a dict into the section of its name, key by key;
    anything else replaces it), credentials scrubbed; return the whole."""
    details = read(uri, run_id)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(details.get(key), dict):
            details[key] = {**details[key], **value}
        else:
            details[key] = value
    tracking.log_text(uri, run_id, json.dumps(scrub_all(details), indent=1, sort_keys=True,
                                              default=str), ARTIFACT)
    return details


def scrub_all(details: dict) -> dict:
    """tracking's scrub on every value, sections included (a model source or storage URI with a
    password in it); keys are names wellfed chose, so only values are redacted here."""
    return {key: ({k: redact(v) for k, v in value.items()} if isinstance(value, dict)
                  else redact(value)) for key, value in details.items()}


def log_derived(uri: str, run_id: str, derived: dict[str, Any],
                more: dict[str, Any] | None = None) -> None:
    """What wellfed decided (`derived.*` names): SEARCHED as run tags, the rest into the details'
    `derived` section, with `more` sections in the same write."""
    tags = {k: v for k, v in derived.items() if k in SEARCHED}
    rest = {k.removeprefix("derived."): v for k, v in derived.items() if k not in SEARCHED}
    if tags:
        tracking.set_tags(uri, run_id, tags)
    if rest or more:
        update(uri, run_id, {**({"derived": rest} if rest else {}), **(more or {})})
