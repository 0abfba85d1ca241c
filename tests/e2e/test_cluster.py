"""Scale-out and faults, for real on CPU: a simulated 2-node cluster, a `ray start` cluster, a
killed worker, a killed driver, a scaling request the cluster cannot satisfy, a read-only
output folder, and an error no retry can fix."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import read_only
from tests.e2e.pipeline import details, env, make_project, mlflow_runs, run
from tests.services import free_port

pytestmark = pytest.mark.e2e
TRAIN = ["python", "stages/train.py", "data/tokens", "data/model", "data/train", "data/checkpoints"]


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_model_dir):
    """A project copy with the token files built (tiny random BERT)."""
    dest = tmp_path_factory.mktemp("cluster")
    make_project(dest, {"model": {"name": str(tiny_model_dir), "init": "random"},
                        "train": {"epochs": 1, "lr": 2e-3, "global_batch_size": 16,
                                  "micro_batch_size": 8, "report_every": 5,
                                  "checkpoint_every": 10, "eval_every": 0},
                        "ray": {"num_workers": 2, "cpus_per_worker": 1}})
    run(["dvc", "repro", "tokenize"], dest)
    return dest


def set_params(project: Path, **sections) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    for section, values in sections.items():
        params[section].update(values)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def fresh(base: Path, tmp_path: Path, **sections) -> Path:
    """An isolated copy (own MLflow db and checkpoints) of the tokenized project."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    dest = tmp_path / "p"
    subprocess.run(["cp", "-a", str(base), str(dest)], check=True)
    set_params(dest, **sections)
    return dest


def loss_steps(project: Path) -> list[int]:
    client, runs = mlflow_runs(project)
    assert len(runs) == 1
    return [m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss")]


def test_impossible_scaling_fails_fast_with_a_clear_message(base, tmp_path):
    project = fresh(base, tmp_path, ray={"num_workers": 5, "cpus_per_worker": 1})
    started = time.time()
    proc = run(TRAIN, project, check=False, timeout=300)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ray.num_workers = 5 workers with 1 CPU(s) each do not fit")
    assert "lower ray.num_workers" in last
    assert time.time() - started < 120 and not (project / "data" / "model").exists()


def test_two_node_cluster_spread_workers_through_shared_storage(base, tmp_path):
    from ray.cluster_utils import Cluster

    shared = tmp_path / "shared-storage"
    project = fresh(base, tmp_path, ray={"num_workers": 2, "cpus_per_worker": 1,
                                         "placement_strategy": "STRICT_SPREAD",
                                         "storage_path": str(shared)})
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        extra = {"RAY_ADDRESS": cluster.address, "WELLFED_CACHE": str(tmp_path / "cache"),
                 "RAY_AUTH_MODE": "disabled"}  # as the in-process test cluster runs
        started = time.time()
        proc = subprocess.run(TRAIN, cwd=project, env={**env(), **extra}, capture_output=True,
                              text=True, timeout=600)
        seconds = time.time() - started
    finally:
        cluster.shutdown()
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"\n2-node run (2 workers, shared-storage data route): {seconds:.1f} s")
    assert "token files uploaded to" in proc.stdout
    staged = list((shared / "wellfed-tokens").iterdir())
    assert len(staged) == 1 and (staged[0] / "_COMPLETE").is_file()
    assert (tmp_path / "cache" / "tokens" / staged[0].name / "train.arrow").is_file()
    _, runs = mlflow_runs(project)
    assert details(project, runs[0])["derived"]["worker_nodes"] == 2  # one worker per node
    assert (project / "data" / "model" / "config.json").is_file()


def test_pipeline_joins_a_ray_start_cluster(base, tmp_path):
    port = free_port()
    head = subprocess.Popen(["ray", "start", "--head", "--node-ip-address", "127.0.0.1",
                             f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                             "--block"], cwd=tmp_path, env=env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        project = fresh(base, tmp_path)
        proc = None
        probe = f"import ray; ray.init(address='127.0.0.1:{port}'); ray.shutdown()"
        for _ in range(30):  # wait for the head to accept clients
            if subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120,
                              env={**env(), "RAY_AUTH_MODE": "token"}).returncode == 0:
                break
            time.sleep(1)
        # `ray start` clusters use token auth by default; a client must opt in to send the token.
        proc = subprocess.run(TRAIN, cwd=project, capture_output=True, text=True, timeout=600,
                              env={**env(), "RAY_ADDRESS": f"127.0.0.1:{port}",
                                   "RAY_AUTH_MODE": "token"})
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # only the processes this test started
        head.wait(timeout=60)
        # `ray start` recorded this cluster as the machine's current one; a stale record makes
        # later local Ray runs' state-API clients wait on a dead GCS.
        current = Path("/tmp/ray/ray_current_cluster")
        if current.is_file() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()
    assert proc is not None and proc.returncode == 0, proc.stderr[-3000:]
    assert f"ray: 127.0.0.1:{port}" in proc.stderr + proc.stdout
    assert (project / "data" / "model" / "config.json").is_file()


def wait_for_checkpoint(project: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until Ray has registered a checkpoint the store wrote (Ray's record of it, its manager's
    snapshot, is in the launch folder: a worker restart now resumes from it)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if list((project / "data" / "checkpoints").glob("wf-*/*/checkpoint_manager_snapshot.json")):
            return
        assert proc.poll() is None, f"training ended before the first checkpoint:\n{proc.stdout.read()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError("no checkpoint appeared")


def ray_workers(root: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(root).children(recursive=True)
            if "RayTrainWorker" in " ".join(p.cmdline())]


def test_a_killed_worker_resumes_from_its_checkpoint_without_repeating_steps(base, tmp_path):
    project = fresh(base, tmp_path, train={"epochs": 4}, ray={"max_failures": 2})
    proc = subprocess.Popen(TRAIN, cwd=project, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    wait_for_checkpoint(project, proc)
    workers = ray_workers(proc.pid)
    assert len(workers) == 2
    logged_before = loss_steps(project)
    workers[1].kill()
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    resumed = [line for line in out.splitlines() if "resuming from step" in line]
    assert resumed, out[-3000:]
    resume_step = int(resumed[0].split("resuming from step ")[1].split()[0])
    lost = max(logged_before or [0]) - resume_step
    print(f"\nworker killed after step {max(logged_before or [0])}; resumed from {resume_step} "
          f"({max(lost, 0)} steps recomputed, checkpoint interval 10)")
    assert lost <= 10 + 5  # at most one checkpoint interval (+ one report interval in flight)
    steps = loss_steps(project)
    assert steps == list(range(1, 4 * 38 + 1))  # 600 rows / 16 = 38 steps x 4 epochs, once each
    train = json.loads((project / "data" / "train" / "metrics.json").read_text())
    assert train["train/rows"] == 4 * 600


def command_line(p: psutil.Process) -> str:
    """`p`'s command line, or "" for a process gone while being read."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def stage_process(root: int, script: str) -> psutil.Process:
    """The stage under `root` running `script`: the topmost such process. A child the stage is
    forking (a `git`, Ray's reaper) shows the stage's command line until its exec: CI once saw
    two."""
    found = {}
    for p in psutil.Process(root).children(recursive=True):
        try:
            if script in " ".join(p.cmdline()):
                found[p.pid] = (p, p.ppid())
        except psutil.Error:  # gone while being read
            pass
    (stage,) = [p for p, parent in found.values() if parent not in found]
    return stage


def test_a_killed_driver_leaves_no_ray_process_and_resumes_on_rerun_into_the_same_run(
        base, tmp_path):
    """SIGKILL to the train stage alone (the OOM killer's way) on Ray Train under dvc, once Ray
    has registered a checkpoint: no cleanup runs in it, the raylet dies with it, and the reaper
    in the daemons' process group (train/checkpoints/preemption.py) ends the rest (Ray's
    DashboardAgent and RuntimeEnvAgent outlived the driver by 1.5 to 3 minutes before). The
    rerun resumes from the checkpoint into the same MLflow run, each step logged once. (One run
    for both points, where two tests trained a run each.)"""
    project = fresh(base, tmp_path, train={"epochs": 2})  # 76 steps, a checkpoint every 10
    proc = subprocess.Popen(["dvc", "repro", "train"], cwd=project, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    wait_for_checkpoint(project, proc)
    stage = stage_process(proc.pid, "stages/train.py")
    tree = stage.children(recursive=True)
    names = " ".join(command_line(p) for p in tree)
    assert "DashboardAgent" in names and "RuntimeEnvAgent" in names, names
    killed = time.time()  # at the first checkpoint Ray registered: training goes on past it
    stage.kill()
    proc.communicate(timeout=120)

    def alive() -> list[str]:
        left = []
        for p in tree:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    left.append(" ".join(p.cmdline()))
            except psutil.NoSuchProcess:
                pass
        return left

    while alive() and time.time() < killed + 30:
        time.sleep(0.5)
    assert not alive(), alive()
    print(f"\nevery Ray process of the run gone {time.time() - killed:.1f} s after the SIGKILL")
    before = loss_steps(project)
    again = run(["dvc", "repro", "train"], project, timeout=600)
    out = again.stdout + again.stderr
    assert sum("resuming interrupted run" in line for line in out.splitlines()) == 1, out[-5000:]
    lines = [line for line in out.splitlines() if "resuming from step" in line]
    assert len(lines) == 1, out[-5000:]  # said once (rank 0), not by the driver too
    resumed_at = int(lines[0].split("resuming from step ")[1].split()[0])
    print(f"{lines[0].strip()} (last step logged before the kill: {max(before or [0])})")
    assert 0 < resumed_at <= max(before)
    steps = loss_steps(project)
    assert steps == list(range(1, 77))  # continuous, no repeats, the planned number of steps
    train = json.loads((project / "data" / "train" / "metrics.json").read_text())
    assert train["train/rows"] == 2 * 600


def test_a_read_only_data_folder_fails_before_training_or_at_the_export_and_the_rerun_exports(
        base, tmp_path):
    """`data/` unwritable from the start: one line naming the folder and the fix, before any
    step or MLflow run (it used to train all steps first). Made unwritable while training: the
    export's same line, no `data/.model.tmp-*`, the MLflow run FAILED; fixed, the rerun resumes
    the run, trains nothing, exports, and counts both processes' seconds. Then what a completed
    run keeps."""
    project = fresh(base, tmp_path, train={"epochs": 3}, ray={"num_workers": 1})
    checkpoints = tmp_path / "ckpt"  # outside data/: training checkpoints, the export cannot write
    train = [*TRAIN[:-1], str(checkpoints)]
    line = ("error: cannot write data: it is not writable ([Errno 1] Operation not permitted); "
            "make it writable, then rerun `dvc repro`")
    with read_only(project / "data"):
        proc = run(train, project, check=False, timeout=600)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == line, proc.stderr
    assert "[wellfed] step " not in proc.stdout and not (project / "mlflow.db").exists()
    assert not list(checkpoints.glob("wf-*/*-in_process"))  # no launch: nothing trained
    started = subprocess.Popen(train, cwd=project, env=env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list(checkpoints.glob("wf-*/*/checkpoint_*/registered")):  # training under way
        assert started.poll() is None and time.time() < deadline, started.communicate()
        time.sleep(0.05)
    with read_only(project / "data"):
        _, err = started.communicate(timeout=600)
        assert started.returncode == 1 and err.strip().splitlines()[-1] == line, err[-3000:]
        assert not list((project / "data").glob(".model*")) and not (project / "data" / "model").exists()
    _, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    (launch,) = checkpoints.glob("wf-*/01-in_process/launch.json")
    first = json.loads(launch.read_text())["seconds"]
    again = run(train, project, timeout=600)
    out = again.stdout + again.stderr
    assert "[wellfed] resuming interrupted run" in out and "[wellfed] step " not in out  # no steps
    _, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    metrics = {**json.loads((project / "data" / "train" / "metrics.json").read_text()),
               **json.loads((project / "data" / "train" / "speed" / "metrics.json").read_text())}
    assert metrics["train/seconds"] > first > 0  # both processes count
    assert metrics["train/rows"] == 3 * 600
    # Completed: the exported checkpoint only, no optimizer state, its weights hard links to
    # the MLflow model's files; the stage says what it leaves.
    (kept,) = [p for p in checkpoints.glob("wf-*/*/checkpoint_*") if p.is_dir()]
    assert sorted(p.name for p in kept.iterdir()) == ["hf_model", "manifest.json", "registered",
                                                      "train_state.json", "val_logits.npy"]
    assert (kept / "hf_model" / "model.safetensors").stat().st_nlink == 2
    assert "[wellfed] this run leaves " in out


def test_a_permanent_worker_error_is_not_retried_by_ray(base, tmp_path):
    """On Ray Train with ray.max_failures 2: a worker dies and the checkpoint Ray restarts the
    group from is damaged meanwhile. The restarted workers cannot read it, an error no retry
    fixes: the stage ends with its line, without the third attempt that would fail alike."""
    project = fresh(base, tmp_path, train={"epochs": 4}, ray={"max_failures": 2})
    # RAY_DEDUP_LOGS=0: each worker's lines under its own pid, not "[repeated 2x across cluster]"
    proc = subprocess.Popen(TRAIN, cwd=project, env={**env(), "RAY_DEDUP_LOGS": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    wait_for_checkpoint(project, proc)
    workers = ray_workers(proc.pid)
    for weights in (project / "data" / "checkpoints").glob("wf-*/*/checkpoint_*/model.pt"):
        with open(weights, "r+b") as f:
            f.truncate(1000)
    workers[1].kill()
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"error: checkpoint \S+/checkpoint_\d+: model.pt cannot be read \(.*\); "
                        r"rerun `dvc repro`: it checks .*", last), last
    # Ray prints each failed worker's error under its pid: the restarted group's 2 workers (a
    # third attempt reading the same checkpoint would fail too, under 2 more pids).
    failed = set(re.findall(
        r"RayTrainWorker pid=(\d+)\)\S* wellfed.train.checkpoints.checkpoint.Damaged", out))
    print(f"\nworkers that failed on the damaged checkpoint: {len(failed)}")
    assert 1 <= len(failed) <= 2, out[-5000:]
