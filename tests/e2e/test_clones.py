"""Two clones of one commit, at different paths, reproduce the same outputs: `dvc repro tokenize`
records the same data/tokens hash in both dvc.lock files, so a team can share a DVC remote
cache, and the whole `dvc repro`, one of them run as a plain shell would, records the same hash
for every output. The model is a folder inside the project, named by a relative path in params.yaml (the
packaged default: tests/test_stages.py); train loads it from where this clone has it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.pipeline import details, env, mlflow_runs, run, tiny_project

pytestmark = pytest.mark.e2e


def lock_hashes(project: Path) -> dict[str, str]:
    """Output path -> md5 as the clone's dvc.lock records it."""
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    return {out["path"]: out["md5"] for stage in lock["stages"].values()
            for out in stage.get("outs", [])}


def test_two_clones_of_one_commit_write_the_same_token_hash(tmp_path, tiny_model_dir):
    origin = tmp_path / "origin"
    origin.mkdir()
    tiny_project(origin, tiny_model_dir)
    run(["git", "add", "-A"], origin)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "model"],
        origin)
    clones = [tmp_path / "alice" / "wellfed", tmp_path / "bob" / "work" / "wellfed"]
    for clone in clones:
        clone.parent.mkdir(parents=True)
        run(["git", "clone", "-q", str(origin), str(clone)], tmp_path)
        run(["dvc", "repro", "tokenize"], clone)
    # The data and its reports; data/reports/time/*.json say where each clone's seconds went.
    data = ("data/prepared", "data/tokens", "data/reports/prepare.json", "data/reports/tokens.json")
    hashes = [{path: lock_hashes(clone)[path] for path in data} for clone in clones]
    assert hashes[0] == hashes[1], hashes
    for clone in clones:
        for path in (clone / "data" / "tokens").rglob("*"):
            if path.is_file():
                assert str(tmp_path).encode() not in path.read_bytes(), path
    # The whole pipeline, in both, the second as a plain shell runs it (HF_HUB_OFFLINE off,
    # another user and time zone): every output dvc.lock records is the same bytes, data/model
    # (with its copy of the tokenizer) too; what differs on every run, timing and MLflow ids, is
    # written beside the outputs, not as one. So a fresh clone's `make run` leaves the committed
    # dvc.lock as it was, and `make run` and a queued trial share a DVC cache.
    run(["dvc", "repro"], clones[0])
    shell = {**env(), "HF_HUB_OFFLINE": "0", "USER": "someone-else", "TZ": "Pacific/Chatham"}
    done = subprocess.run(["dvc", "repro"], cwd=clones[1], env=shell, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    whole = [lock_hashes(clone) for clone in clones]
    assert whole[0] == whole[1] and len(whole[0]) >= 14, whole
    assert not [path for path in whole[0] if "time" in path or path.endswith("run.json")]
    # Train resolves the relative name in its own clone, and reads git as the code's state.
    _, runs = mlflow_runs(clones[1])
    tags = runs[-1].data.tags
    assert details(clones[1], runs[-1])["derived"]["model_source"] == \
        str((clones[1] / "models" / "tiny").resolve())
    assert tags["git.dirty"] == "false" and "git.changed" not in tags, tags
