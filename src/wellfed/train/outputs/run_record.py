"""data/train/run.json: the MLflow run (and model version) of the train run that exported
data/model, on this machine; evaluate appends to that run.

Not a DVC output: it names this machine's MLflow store (an absolute sqlite path) and a run id
that is new on every train run, so as an output its hash in dvc.lock changed on every run and a
fresh clone's `make run` left dvc.lock modified. The train stage writes it beside its outputs
(gitignored) and evaluate reads it. It holds the digest of the data/model it belongs to, so
evaluate never appends one model's scores to another model's run: after a `dvc exp apply`, a
checkout or a `dvc pull` of outputs trained elsewhere, data/model is not the one it names."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from wellfed.outputs import write_json

RERUN = "dvc repro -f evaluate"
"""Reruns the pipeline up to evaluate: train records its run here, evaluate appends to it."""


def model_digest(model_dir: str | Path) -> str:
    """sha256 over data/model's files, by relative path and content (~0.3 s for MiniLM's 90 MB)."""
    digest = hashlib.sha256()
    root = Path(model_dir)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def write(path: str | Path, model_dir: str | Path, record: dict) -> None:
    """run.json: `record` (mlflow_run_id, tracking_uri, ...) and the digest of `model_dir`."""
    write_json(path, {**record, "model_digest": model_digest(model_dir)})


def read(path: str | Path, model_dir: str | Path) -> dict:
    """The record of the train run that exported `model_dir`; one line that says what to run
    when there is none here, or when it belongs to another model."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: not found: it names the MLflow run of the train stage that made "
            f"{model_dir}, and only that stage writes it, on the machine it runs on (it names "
            f"this machine's MLflow store, so it is not a DVC output); run: {RERUN}") from None
    except ValueError as err:
        raise ValueError(f"{path}: not a run record ({err}); run: {RERUN}") from None
    if record.get("model_digest") != model_digest(model_dir):
        raise ValueError(
            f"{path} names MLflow run {record.get('mlflow_run_id')}, whose model is not "
            f"{model_dir} (a `dvc exp apply`, checkout or pull since it trained?); to record "
            f"this model in a run of its own, run: {RERUN}")
    return record
