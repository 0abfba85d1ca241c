"""Helpers to run the real pipeline in a throwaway copy of the project."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parents[2]


def make_project(dest: Path, params: dict, raw_rows: dict[str, int] | None = None) -> Path:
    """Copy the pipeline into `dest` as its own git + DVC repo, with `params` merged in."""
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(PROJECT / name, dest / name)
    for name in ("stages", "src"):
        shutil.copytree(PROJECT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    raw = dest / "data" / "raw"
    raw.mkdir(parents=True)
    for name, limit in (raw_rows or {"train.tsv": 600, "dev.tsv": 150, "test.tsv": 150}).items():
        lines = (PROJECT / "data" / "raw" / name).read_text(encoding="utf-8").splitlines(True)
        (raw / name).write_text("".join(lines[:limit + 1]), encoding="utf-8")
    current = yaml.safe_load((dest / "params.yaml").read_text())
    for section, values in params.items():
        current.setdefault(section, {}).update(values)
    (dest / "params.yaml").write_text(yaml.safe_dump(current, sort_keys=False))
    # The project's own: MLflow's store, and what the stages write beside their outputs that
    # differs on every run (timing, speed reports, run.json, checkpoints), never committed.
    shutil.copy(PROJECT / ".gitignore", dest / ".gitignore")
    run(["git", "init", "-q"], dest)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty",
         "-m", "init"], dest)
    run(["dvc", "init", "-q"], dest)
    run(["dvc", "config", "core.analytics", "false"], dest)
    run(["git", "add", "-A"], dest)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "pipeline"], dest)
    return dest


TINY = {"model": {"name": "models/tiny", "init": "random"},
        "train": {"max_steps": 4, "global_batch_size": 16, "micro_batch_size": 16,
                  "eval_every": 4, "checkpoint_every": 4},
        "ray": {"num_workers": 1, "cpus_per_worker": 1}}
"""Four steps of the tiny random-init model on one in-process worker: a pipeline that runs."""


def tiny_project(dest: Path, tiny_model_dir: Path) -> Path:
    """`make_project` with TINY and 120/30/30 rows, the tiny model copied in as models/tiny
    (a path inside the project, the same in every clone of it)."""
    make_project(dest, TINY, {"train.tsv": 120, "dev.tsv": 30, "test.tsv": 30})
    shutil.copytree(tiny_model_dir, dest / "models" / "tiny")
    return dest


def threads() -> int:
    """This test's share of the cores: all of them run alone, cores / workers beside other
    pytest-xdist workers (PYTEST_XDIST_WORKER_COUNT). Two workers' stages each on both of 2
    cores spin torch's threads against each other: the GoEmotions run's 250 steps took 996 s
    so, against ~1 min alone, and ran past its 20-minute deadline."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // workers)


def env() -> dict:
    out = dict(os.environ)
    out["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{out['PATH']}"
    out.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
    # torch's default threads in the stages that choose none (tokenize, evaluate, predict): the
    # test's share of the cores (the train stage takes ray.cpus_per_worker)
    out.setdefault("OMP_NUM_THREADS", str(threads()))
    for key in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "DVC_EXP_NAME", "DVC_ROOT"):
        out.pop(key, None)
    return out


def run(cmd: list[str], cwd: Path, check: bool = True, timeout: int = 900):
    proc = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def mlflow_runs(project: Path, experiment: str = "wellfed"):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], order_by=["start_time ASC"])


def details(project: Path, run_) -> dict:
    """The run's details (track/run_details.py: what it records that is not a tag)."""
    from wellfed.track import run_details

    return run_details.read(f"sqlite:///{project / 'mlflow.db'}", run_.info.run_id)
