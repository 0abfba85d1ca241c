"""A node lost while training, on a real two-raylet cluster (tests/e2e/raycluster.py): Ray
Train's two workers, one per node, and the second node killed outright after the first
checkpoint. Ray restarts the group at most `ray.max_failures` times, then the run goes on with
the one worker that fits, the same global batch, into the same MLflow run
(`ray.on_lost_node: shrink`), no step lost or logged twice. Before, Ray retried the 2-worker
group forever (WorkerGroupStartupTimeoutError 8 times in 9.5 minutes, the run RUNNING)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.e2e.pipeline import env, make_project, mlflow_runs, run
from tests.e2e.raycluster import ray_cluster
from tests.e2e.test_cluster import TRAIN, loss_steps, wait_for_checkpoint

pytestmark = pytest.mark.e2e
EPOCHS = 6  # 228 steps of the tiny model: ~8 s on two workers here; the kill lands by step 40-175


def test_a_lost_node_leaves_the_run_on_the_worker_that_fits(tmp_path, tiny_model_dir):
    project = tmp_path / "p"
    project.mkdir()
    make_project(project, {"model": {"name": str(tiny_model_dir), "init": "random"},
                           "train": {"epochs": EPOCHS, "lr": 2e-3, "global_batch_size": 16,
                                     "micro_batch_size": 8, "report_every": 5,
                                     "checkpoint_every": 20, "eval_every": 0},
                           "ray": {"num_workers": 2, "cpus_per_worker": 1, "max_failures": 1}})
    run(["dvc", "repro", "tokenize"], project)
    with ray_cluster([1, 1], base_env=env()) as cluster:
        # Ray waits this long for a worker group it cannot place before a restart counts as
        # failed (60 s by default): the test's two failed starts take 10 s instead of 120.
        environ = {**cluster.env, "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "5"}
        started = time.time()
        proc = subprocess.Popen(TRAIN, cwd=project, env=environ, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        wait_for_checkpoint(project, proc, timeout=400)
        logged = max(loss_steps(project) or [0])
        killed = cluster.kill_node(1)
        out, _ = proc.communicate(timeout=600)
        ended = time.time()
    assert proc.returncode == 0, out[-5000:]
    lines = [line for line in out.splitlines() if "a node was lost" in line]
    assert len(lines) == 1, out[-5000:]
    assert "room for 1 of the run's 2 worker(s)" in lines[0], lines[0]
    assert "continuing on 1 worker(s) from step " in lines[0], lines[0]
    assert "the same global batch of 16 rows (2 micro-batch(es) per worker per step)" in lines[0]
    resumed = int(lines[0].split("continuing on 1 worker(s) from step ")[1].split(",")[0])
    _, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    tags = runs[0].data.tags
    assert tags["derived.world_sizes"] == "2,1" and tags["derived.world_size"] == "1", tags
    assert tags["wellfed.lost_node"] == lines[0].split("[wellfed] ", 1)[1]
    steps = loss_steps(project)
    assert steps == list(range(1, EPOCHS * 38 + 1))  # 600 rows / 16 = 38 steps per epoch, once each
    metrics = json.loads((project / "data" / "train" / "metrics.json").read_text())
    assert metrics["train/rows"] == EPOCHS * 600  # the same global batch on one worker
    print(f"\nnode killed {killed - started:.1f} s into the stage, after step {logged} was "
          f"logged; resumed from step {resumed} on 1 worker ({max(logged - resumed, 0)} step(s) "
          f"redone, checkpoint interval 20); the stage ended {ended - killed:.1f} s after the "
          f"kill, {len(steps)} steps logged once each")
