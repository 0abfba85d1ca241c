"""A sweep on a Ray cluster, as a user runs it: a `ray start --head` declaring 2 GPUs (logical:
this machine has none, so the trials train on the CPU), three queued `dvc exp run` trials of
one sweep run by `dvc queue start -j 3`. Ray places each trial (one Ray task, not Ray Train):
at most two train at once, each on a GPU of its own; the third waits in Ray's queue. All three
land in MLflow with every metric a solo run has, nested under the sweep's parent run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.pipeline import env, make_project, mlflow_runs, run
from tests.services import free_port

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tiny_model_dir):
    dest = tmp_path_factory.mktemp("sweep")
    make_project(dest, {"model": {"name": str(tiny_model_dir), "init": "random"},
                        "train": {"epochs": 1, "lr": 2e-3, "global_batch_size": 16,
                                  "micro_batch_size": 16, "report_every": 4,
                                  "checkpoint_every": 100, "eval_every": 0},
                        "ray": {"num_workers": 1, "cpus_per_worker": 1}})
    run(["dvc", "repro"], dest)  # the solo run, in-process: the baseline the trials queue on
    port = free_port()
    head = subprocess.Popen(["ray", "start", "--head", "--node-ip-address", "127.0.0.1",
                             f"--port={port}", "--num-cpus=3", "--num-gpus=2",
                             "--include-dashboard=false", "--block"], cwd=dest, env=env(),
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    cluster = {**env(), "RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token"}
    try:
        probe = f"import ray; ray.init(address='127.0.0.1:{port}'); ray.shutdown()"
        for _ in range(60):  # until the head takes clients
            if subprocess.run([sys.executable, "-c", probe], capture_output=True, env=cluster,
                              timeout=120).returncode == 0:
                break
            time.sleep(1)
        for seed in (1, 2, 3):
            run(["dvc", "exp", "run", "--queue", "-S", f"train.seed={seed}",
                 "-S", "mlflow.sweep=seeds"], dest)
        # No pipes: the queue's workers outlive this command and would hold them open (it then
        # returned only once the three trials had ended, past its 120 s on a loaded machine).
        subprocess.run(["dvc", "queue", "start", "-j", "3"], cwd=dest, env=cluster, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        status = wait_for_queue(dest, cluster, timeout=900)
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        current = Path("/tmp/ray/ray_current_cluster")
        if current.is_file() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()
    return dest, status


def wait_for_queue(project: Path, environ: dict, timeout: float) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = subprocess.run(["dvc", "queue", "status"], cwd=project, env=environ,
                                capture_output=True, text=True, timeout=120).stdout
        if not any(word in status for word in ("Queued", "Running")):
            return status
        time.sleep(10)  # each look is a dvc process (~1 s of CPU), taken from the trials
    raise AssertionError(f"the queue did not finish in {timeout} s")


def window(client, run) -> tuple[float, float]:
    """When the trial trained: its first and last train/loss reports (ms)."""
    history = client.get_metric_history(run.info.run_id, "train/loss")
    stamps = sorted(m.timestamp for m in history)
    return stamps[0], stamps[-1]


def test_trials_are_placed_on_their_own_gpus_two_at_a_time(sweep):
    project, status = sweep
    assert status.count("Success") == 3, status
    client, runs = mlflow_runs(project)
    trials = [r for r in runs if r.data.tags.get("wellfed.sweep") == "seeds"
              and "wellfed.sweep_parent" not in r.data.tags]
    assert len(trials) == 3
    assert {r.data.tags["derived.engine"] for r in trials} == {"ray_task"}
    devices = {r.info.run_id: r.data.tags["derived.placement"].split("CUDA_VISIBLE_DEVICES=")[1]
               for r in trials}
    assert set(devices.values()) <= {"0", "1"}, devices
    windows = {r.info.run_id: window(client, r) for r in trials}
    for rid, (start, _) in windows.items():
        running = [other for other, (s, e) in windows.items() if s <= start <= e]
        assert len(running) <= 2, windows  # the third waited in Ray's queue
        assert len({devices[r] for r in running}) == len(running)  # each on its own GPU


def test_every_trial_is_complete_and_nested_under_the_sweep(sweep):
    project, _ = sweep
    client, runs = mlflow_runs(project)
    solo = runs[0]
    assert solo.data.tags["derived.engine"] == "in_process"
    parents = [r for r in runs if r.data.tags.get("wellfed.sweep_parent") == "seeds"]
    assert len(parents) == 1 and parents[0].info.run_name == "sweep seeds"
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(trials) == 3 and {r.data.params["train.seed"] for r in trials} == {"1", "2", "3"}
    # Queued trials run in copies of the project under .dvc/tmp/exps, without git-ignored files
    # such as mlflow.db: each still lands in the project's own store, named as its experiment.
    assert not list((project / ".dvc" / "tmp").rglob("mlflow.db"))
    assert all(r.info.run_name == r.data.tags["dvc.exp_name"] for r in trials)
    for trial in trials:
        assert trial.info.status == "FINISHED"
        assert sorted(trial.data.metrics) == sorted(solo.data.metrics)  # nothing lost
        assert "eval/macro_f1" in trial.data.metrics
    shown = run(["dvc", "exp", "show", "--json"], project).stdout
    assert len(json.loads(shown)) >= 1 and "seeds" in shown
    # The parent summarises its trials, brought up to date by each trial's evaluate stage.
    summary = parents[0].data
    assert summary.metrics["sweep/trials"] == 3 and summary.metrics["sweep/recipes"] == 1
    best = max(t.data.metrics["eval/macro_f1"] for t in trials)
    assert summary.metrics["sweep/best/eval/macro_f1"] == best
    assert summary.tags["mlflow.note.content"].startswith("### sweep seeds: best recipe ")
    assert "3 of 3 trials evaluated" in summary.tags["mlflow.note.content"]
    assert parents[0].info.end_time == max(t.info.end_time for t in trials)
