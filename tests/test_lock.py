"""dvc.lock is current with what git holds: `dvc status` names no changed dep that is not a
stage's output (the code, params.yaml, data/raw) and no changed command. Otherwise a fresh clone
reruns stages nobody changed, and a DVC remote's cache does not match its hashes.

After changing a stage's code, params or raw data: `dvc repro`, then commit dvc.lock (with
the tracked outputs it records)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import PROJECT
from wellfed.track.provenance import pipeline_outputs


def stale(status: dict, outputs: list[str]) -> list[str]:
    """`dvc status --json`'s findings that a committed dvc.lock must not have: changed deps
    that no stage writes (a missing output is only a clone that has not run yet), changed
    commands. One line each: `stage: path (modified)`."""
    found = []
    for stage, entries in status.items():
        for entry in entries:
            if isinstance(entry, str):
                if entry != "always changed":
                    found.append(f"{stage}: {entry}")
                continue
            for path, change in entry.get("changed deps", {}).items():
                if not any(path == out or path.startswith(out + "/") for out in outputs):
                    found.append(f"{stage}: {path} ({change})")
    return found


def test_dvc_lock_records_the_code_params_and_raw_data_git_holds():
    proc = subprocess.run([str(Path(sys.executable).parent / "dvc"), "status", "--json"],
                          cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout or "{}")
    assert set(status) <= {"check", "prepare", "tokenize", "train", "evaluate"}, status
    found = stale(status, pipeline_outputs(PROJECT))
    assert not found, ("dvc.lock is older than " + "; ".join(found) + ": run `dvc repro` and "
                       "commit dvc.lock, or a fresh clone reruns these stages")


def test_the_check_names_changed_code_and_params_but_not_missing_outputs():
    status = {"prepare": [{"changed outs": {"data/prepared": "not in cache"}}],
              "tokenize": [{"changed deps": {"data/prepared": "deleted",
                                             "src/wellfed/model.py": "modified",
                                             "params.yaml": {"model.name": "modified"}}}],
              "train": ["changed command", {"changed deps": {"data/tokens": "deleted"}}],
              "evaluate": ["always changed"]}
    assert stale(status, ["data/prepared", "data/tokens"]) == [
        "tokenize: src/wellfed/model.py (modified)",
        "tokenize: params.yaml ({'model.name': 'modified'})", "train: changed command"]
