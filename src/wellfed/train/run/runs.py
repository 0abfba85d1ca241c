"""Run bookkeeping, in one place: what names a training run, where its checkpoints and run file
live, whether it resumes, and what is cleaned up when it completes.

Resuming is deliberate: Ray resumes any run whose storage path and name are reused, so the name is a
hash of everything that defines the run's result (train/model params and the token files). Unchanged
inputs after an interrupted run -> resume from its newest good checkpoint
(train/checkpoints/store.py) into the same MLflow run; changed inputs -> a new name, a fresh start.
A completed run's directory is cleared before a forced re-run. The run file (`wellfed_run.json`,
beside the store's launch folders) holds the MLflow run id and whether the run completed.

A run that completed after the dvc running it had gone is kept for the rerun to hand to dvc
(train/run/orphan.py), not trained again.

That name is a key, not a title: MLflow shows a run by its `title` (the DVC experiment's name,
or a summary of the recipe) and keeps the key and the full hash as tags.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.fs as pafs

from wellfed import watchdog
from wellfed.cli import Interrupted
from wellfed.config import ModelConfig, TrainConfig, number
from wellfed.data import staging
from wellfed.data.token_files import TokenFile
from wellfed.outputs import write_fault
from wellfed.train.run import orphan

RUN_FILE = "wellfed_run.json"
TRACEBACK = "traceback.txt"
"""Beside the checkpoints: the traceback of an in-process failure (train/run/local.py), removed once
the run finishes."""


@dataclass(frozen=True)
class Run:
    """One training run's identity and storage."""

    name: str
    """wf-<hash>: the run's folder under `storage_uri`, so reusing it resumes."""
    storage_uri: str
    """Where the run's checkpoints are kept (a local folder or shared storage)."""
    data_hash: str
    """sha256 of the train and validation token files."""
    resume_id: str | None
    """The MLflow run id of an interrupted run with this name, or None for a fresh start."""
    title: str
    """The MLflow run name people read: $DVC_EXP_NAME under `dvc exp run`, else a summary of
    the recipe (`minilm-lr1e-4-b32-3f2a`); tracking.start_run numbers a repeat (`...-2`)."""
    run_hash: str
    """The full sha256 that `name` abbreviates (`run_hash` in the run's details)."""
    inputs: str | None = None
    """`inputs_digest` of this stage's inputs (None: not asked for, as in tests of the loop)."""

    def info(self) -> dict:
        return {"storage": self.storage_uri, "name": self.name, "inputs": self.inputs}

    def tags(self) -> dict[str, str]:
        """How to find a run in MLflow by its Ray storage folder, whatever its title (the
        folder name is a prefix of the full hash: one tag, the full hash is in the details)."""
        return {"wellfed.run_key": self.name}


def plan(tokens_dir: Path, train_cfg: TrainConfig, model_cfg: ModelConfig, storage_uri: str,
         params: dict | None = None, outputs: list[Path] | None = None) -> Run:
    """Name the run from its inputs and find out whether it resumes an interrupted one (or,
    given every param and the stage's outputs, whether an orphaned completion holds them)."""
    data_hash = file_digest([tokens_dir / "train.arrow", tokens_dir / "validation.arrow"])
    digest = run_hash(train_cfg, model_cfg, data_hash)
    name = run_name(train_cfg, model_cfg, data_hash)
    title = os.environ.get("DVC_EXP_NAME") or run_title(train_cfg, model_cfg, digest)
    inputs = orphan.inputs_digest(digest, params, tokens_dir) if params is not None else None
    return Run(name, storage_uri, data_hash, prepare_storage(storage_uri, name, inputs, outputs),
               title, digest, inputs)


def file_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def run_name(train: TrainConfig, model: ModelConfig, data_hash: str) -> str:
    """Not the worker count: every step's global batch is the same rows whatever the world size
    (only their split over the ranks differs, wellfed.data.batching), and a checkpoint holds the
    unwrapped model, the optimizer and the sampler position, so a run stopped on 2 GPUs resumes
    on 1 with the same steps, into the same MLflow run."""
    return "wf-" + run_hash(train, model, data_hash)[:12]


def run_hash(train: TrainConfig, model: ModelConfig, data_hash: str) -> str:
    """Not train.keep_checkpoints: it decides which files stay, not what is trained."""
    recipe = {k: v for k, v in asdict(train).items() if k != "keep_checkpoints"}
    key = json.dumps([recipe, asdict(model), data_hash], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()


def run_title(train: TrainConfig, model: ModelConfig, digest: str) -> str:
    """`<model>-lr<lr>-b<global batch>-<4 hex of the run hash>`, e.g. minilm-lr1e-4-b32-3f2a:
    the knobs people change most, and a hash that tells apart runs they share."""
    short = "minilm" if model.name == "default" else \
        model.name.rstrip("/").rsplit("/", 1)[-1].lower()[:24] or "model"
    mantissa, exponent = f"{train.lr:e}".split("e")
    lr = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"  # 1e-4, 2.5e-5
    return f"{short}-lr{lr}-b{train.global_batch_size}-{digest[:4]}"


def prepare_storage(storage_uri: str, name: str, inputs: str | None = None,
                    outputs: list[Path] | None = None) -> str | None:
    """When the run `name` was interrupted, its MLflow run id (to resume); when it completed
    after its dvc had gone, with these `inputs`, its kept `outputs` put back and
    `orphan.Recorded`; else clear it."""
    fs, root = staging.filesystem(storage_uri)
    info = f"{root}/{name}/{RUN_FILE}"
    if staging.exists(fs, info):
        with fs.open_input_stream(info) as f:
            saved = json.loads(f.read())
        if not saved.get("complete"):
            return saved.get("mlflow_run_id")
        if isinstance(fs, pafs.LocalFileSystem):
            orphan.found(saved, inputs, Path(root) / name, outputs or [], name)
    if staging.exists(fs, f"{root}/{name}"):
        try:
            fs.delete_dir(f"{root}/{name}")  # a completed run re-run on purpose: start fresh
        except OSError as err:
            raise write_fault(root, err, "then rerun `dvc repro`") from None
    return None


def write_run_file(storage_uri: str, name: str, run_id: str, complete: bool,
                   **record) -> None:
    fs, root = staging.filesystem(storage_uri)
    try:
        fs.create_dir(f"{root}/{name}", recursive=True)
        with fs.open_output_stream(f"{root}/{name}/{RUN_FILE}") as f:
            f.write(json.dumps({"mlflow_run_id": run_id, "complete": complete,
                                **record}).encode())
    except OSError as err:
        raise write_fault(f"{root}/{name}", err, "then rerun `dvc repro`") from None


def mark_complete(info: dict, run_id: str, model: dict | None = None) -> None:
    """The stage finished (model exported, metrics written): a rerun now starts fresh, unless
    the dvc running it had gone (then the record lets the rerun find these outputs)."""
    record = {}
    fs, root = staging.filesystem(info["storage"])
    if (watchdog.orphaned() and info.get("outputs") and info.get("inputs")
            and isinstance(fs, pafs.LocalFileSystem)):
        orphan.keep(Path(root) / info["name"], info["outputs"])
        record = {"orphaned": True, "inputs": info["inputs"], "model": model or {}}
    write_run_file(info["storage"], info["name"], run_id, complete=True, **record)


def kept_while_running(train_cfg: TrainConfig) -> int | None:
    """train.keep_checkpoints as the store's `prune` takes it (None: all)."""
    keep = train_cfg.keep_checkpoints
    return None if keep == "all" else number(keep, integer=True)


def latest_step(store) -> int | None:
    """The step a rerun would resume from (unchecked: preemption's and Ctrl-C's lines)."""
    latest = store.latest()
    return latest.step if latest and latest.launch else None


def planned_steps(job) -> int:
    from wellfed.train.step.setup import total_steps

    return total_steps(len(TokenFile(job.tokens_dir / "train.arrow")), job.train)


def interrupted(run: Run, store) -> Interrupted:
    step = latest_step(store)
    kept = f"the checkpoint of step {step} is kept" if step else "no checkpoint yet"
    return Interrupted(f"training stopped by Ctrl-C ({kept}): rerun `dvc repro` to resume "
                       f"run {run.name} from there, into the same MLflow run")


@contextlib.contextmanager
def training(run: Run, store, launch: str, clock):
    """A launch's training, whatever the engine: its seconds go to `clock` ("train") and to the
    launch's record in the store, even when it fails; Ctrl-C becomes the line that says how to
    resume. A process may train several launches (a lost node: train/run/lost_node.py); each records
    its own seconds."""
    before = clock.seconds.get("train", 0.0)
    try:
        with clock("train"):
            yield
    except KeyboardInterrupt:
        raise interrupted(run, store) from None
    finally:
        store.close_launch(launch, clock.seconds.get("train", 0.0) - before)


def staged_tokens(ray_cfg, tokens_dir: Path, run: Run) -> tuple[str | None, str | None]:
    """(where the token files were staged, their hash) with `ray.storage_path` set, so every
    node reads them from there (multi-node); (None, None) without it."""
    if not ray_cfg.storage_path:
        return None, None
    uri, sent = staging.upload(tokens_dir, run.storage_uri, run.data_hash)
    print(f"[wellfed] token files {'uploaded to' if sent else 'already at'} {uri}", flush=True)
    return uri, run.data_hash

