"""The team store, for real: PostgreSQL and an MLflow server that proxies the artifacts
(tests/e2e/teamstore.py: what `make team-store` starts), a Ray cluster of two raylets
(tests/e2e/raycluster.py), and a sweep of 6 queued `dvc exp run` trials that Ray places on both
nodes, every trial reporting into the server. Faults during the sweep, each with nothing lost:
the second node killed mid-trial (the trial goes on on the head from its checkpoint, into the
same MLflow run; then a replacement node joins), the MLflow server restarted, PostgreSQL
restarted. Afterwards what works on sqlite works there: every metric of every trial, the
registry and @champion, the sweep's parent and its summary, serving models:/...@champion and
wellfed-compare."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.pipeline import env, run
from tests.e2e.raycluster import ray_cluster
from tests.e2e.test_sweep import wait_for_queue
from wellfed import environ

pytestmark = pytest.mark.e2e
SWEEP = "team"
RECIPES, SEEDS = ("2e-3", "5e-3"), (1, 2, 3)
STEPS = 4 * 19  # 4 epochs of 300 rows at a global batch of 16: ~6 s per trial here


def quick():
    """MLflow calls of the test's own watcher: no retries, a short timeout, so that a poll while
    the server is down costs a second, not MLflow's minutes (the trials keep MLflow's own)."""
    return environ.scoped({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                           "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"})


def trial_runs(uri: str) -> list:
    """The sweep's trial runs (not its parent), or [] while the server does not answer."""
    import mlflow

    with quick():
        try:
            client = mlflow.MlflowClient(uri)
            exp = client.get_experiment_by_name("wellfed")
            if exp is None:
                return []
            runs = client.search_runs([exp.experiment_id], f"tags.`wellfed.sweep` = '{SWEEP}'",
                                      max_results=100)
        except Exception:
            return []
    return [r for r in runs if "wellfed.sweep_parent" not in r.data.tags]


def training(runs: list) -> list:
    """Trials between their first report and the end of training (train/rows comes last)."""
    return [r for r in runs if r.info.status == "RUNNING" and "train/loss" in r.data.metrics
            and "train/rows" not in r.data.metrics]


def node_of(run) -> str:
    """The node a trial runs on: the 8 hex digits of derived.placement ("node 1a2b3c4d, ...")."""
    return run.data.tags.get("derived.placement", "")[5:13]


def has_checkpoint(project: Path, run) -> bool:
    """A checkpoint of the trial's run is registered (queued trials run in copies of the project
    under .dvc/tmp/exps/)."""
    name = run.data.tags.get("wellfed.run_key", "")
    return bool(name) and any(project.glob(
        f".dvc/tmp/exps/*/data/checkpoints/{name}/*/checkpoint_*/registered"))


def wait_until(what: str, check, timeout: float = 600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if found := check():
            return found
        time.sleep(1)
    raise AssertionError(f"the sweep never reached the moment for this fault: {what}")


def inject_faults(project: Path, store, cluster) -> dict:
    """While the queue runs: kill node 1 under a trial with a checkpoint, start a replacement
    once that trial runs on the head again, restart the MLflow server while a trial trains,
    then PostgreSQL while another trains. Returns what happened, for the figures."""
    head = cluster.head_id()[:8]
    faults = {}

    def on_node1_with_checkpoint():
        return next((r for r in training(trial_runs(store.uri))
                     if node_of(r) and node_of(r) != head and has_checkpoint(project, r)), None)

    victim = wait_until("a trial training on node 1 with a checkpoint", on_node1_with_checkpoint)
    killed = cluster.kill_node(1)
    faults["node"] = {"run_id": victim.info.run_id, "killed_at": killed}

    def back_on_head():
        runs = [r for r in trial_runs(store.uri) if r.info.run_id == victim.info.run_id]
        return runs and "wellfed.lost_node" in runs[0].data.tags and node_of(runs[0]) == head

    wait_until("the killed trial running again on the head", back_on_head)
    faults["node"]["resumed_after_s"] = time.time() - killed
    cluster.restart_node(1)  # a replacement joins: the rest of the sweep runs two at a time
    for fault, restart in (("server", store.restart_server), ("postgres", store.restart_postgres)):
        active = wait_until(f"a trial training, for the {fault} restart",
                            lambda: training(trial_runs(store.uri)))
        faults[fault] = {"down_s": restart(), "during": [r.info.run_id for r in active]}
    return faults


@pytest.fixture(scope="module")
def sweep(store, tokenized):
    project = tokenized
    # DVC's grid syntax (Hydra): 2 learning rates x 3 seeds = 6 queued trials, one sweep.
    run(["dvc", "exp", "run", "--queue", "-S", f"mlflow.sweep={SWEEP}",
         "-S", f"train.lr={','.join(RECIPES)}", "-S", f"train.seed=range(1,{len(SEEDS) + 1})"],
        project)
    started = time.time()
    with ray_cluster([1, 1], base_env=env()) as cluster:
        try:
            # No pipes: the queue's workers outlive this command and would hold them open.
            subprocess.run(["dvc", "queue", "start", "-j", "2"], cwd=project, env=cluster.env,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=120)
            faults = inject_faults(project, store, cluster)
            status = wait_for_queue(project, cluster.env, timeout=1500)
        finally:
            stop_queue(project)
    faults["sweep_s"] = time.time() - started
    return project, status, faults


def stop_queue(project: Path) -> None:
    """End the queue's workers and whatever they still run (a failed test leaves them running
    its trials): `dvc queue stop --kill`, then any process left whose folder is the project's."""
    import psutil

    subprocess.run(["dvc", "queue", "stop", "--kill"], cwd=project, env=env(),
                   capture_output=True, timeout=120)
    deadline = time.time() + 30
    while time.time() < deadline:
        left = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if p.cwd().startswith(str(project)) and p.pid != os.getpid():
                    left.append(p)
        if not left:
            return
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        time.sleep(1)


def history(uri: str, run_id: str, key: str = "train/loss") -> list[int]:
    import mlflow

    return [m.step for m in mlflow.MlflowClient(uri).get_metric_history(run_id, key)]


def test_every_trial_of_the_sweep_is_whole_through_the_faults(store, sweep):
    import mlflow

    project, status, faults = sweep
    assert status.count("Success") == len(RECIPES) * len(SEEDS), status
    client = mlflow.MlflowClient(store.uri)
    trials = trial_runs(store.uri)
    assert len(trials) == len(RECIPES) * len(SEEDS)
    assert {(r.data.params["train.lr"], r.data.params["train.seed"]) for r in trials} == {
        (str(float(lr)), str(seed)) for lr in RECIPES for seed in SEEDS}
    keys = {tuple(sorted(r.data.metrics)) for r in trials}
    assert len(keys) == 1 and "eval/macro_f1" in keys.pop()  # the same figures in every trial
    lost = {}
    for trial in trials:
        assert trial.info.status == "FINISHED", trial.info
        steps = history(store.uri, trial.info.run_id)
        lost[trial.info.run_id] = len(set(range(1, STEPS + 1)) - set(steps))
        assert steps == list(range(1, STEPS + 1)), (trial.info.run_id, steps)  # once each
    versions = client.search_model_versions("name = 'wellfed-classifier'")
    assert sorted(v.run_id for v in versions) == sorted(r.info.run_id for r in trials)
    for fault in ("server", "postgres"):
        during = faults[fault]["during"]
        print(f"\n{fault} restarted mid-sweep (down {faults[fault]['down_s']:.1f} s) while "
              f"{len(during)} trial(s) trained: {sum(lost[r] for r in during)} train/loss "
              f"steps lost, every trial FINISHED and evaluated")
    print(f"sweep of {len(trials)} trials on 2 nodes with 3 faults: {faults['sweep_s']:.0f} s")


def test_the_trial_whose_node_died_went_on_on_the_head_in_the_same_run(store, sweep):
    import mlflow

    _, _, faults = sweep
    run_id = faults["node"]["run_id"]
    trial = mlflow.MlflowClient(store.uri).get_run(run_id)
    line = trial.data.tags["wellfed.lost_node"]
    assert "its node or process was lost" in line and "(restart 1 of ray.max_failures: 2)" in line
    assert "from the checkpoint of step " in line, line
    resumed = int(line.split("from the checkpoint of step ")[1].split()[0])
    steps = history(store.uri, run_id)
    assert steps == list(range(1, STEPS + 1))  # one run, no step lost or logged twice
    assert 0 < resumed < STEPS
    print(f"\nnode 1 killed under trial {run_id[:8]}: sent again from its checkpoint of step "
          f"{resumed}, running on the head {faults['node']['resumed_after_s']:.1f} s later "
          f"(after the trial there ended); {len(steps)} of {STEPS} steps logged once each")


def test_the_registry_and_the_sweep_parent_work_on_the_server(store, sweep):
    import mlflow

    client = mlflow.MlflowClient(store.uri)
    trials = trial_runs(store.uri)
    best = max(trials, key=lambda r: (r.data.metrics["eval/macro_f1"], -r.info.start_time))
    champion = client.get_model_version_by_alias("wellfed-classifier", "champion")
    assert float(champion.tags["wellfed.eval.value"]) == best.data.metrics["eval/macro_f1"]
    assert champion.tags["wellfed.champion.reason"].startswith("@champion: eval/macro_f1 ")
    splits = {v.tags.get("wellfed.eval.split") for v in
              client.search_model_versions("name = 'wellfed-classifier'")}
    assert len(splits) == 1  # every trial evaluated on the same test split
    (parent,) = client.search_runs([trials[0].info.experiment_id],
                                   f"tags.`wellfed.sweep_parent` = '{SWEEP}'")
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {parent.info.run_id}
    assert parent.data.metrics["sweep/trials"] == len(trials)
    assert parent.data.metrics["sweep/recipes"] == len(RECIPES)


def test_the_champion_is_served_and_the_sweep_compared_through_the_server(store, sweep,
                                                                         tmp_path):
    project, _, _ = sweep
    team_env = {**env(), "MLFLOW_TRACKING_URI": store.uri}
    out = tmp_path / "predictions.parquet"
    proc = subprocess.run(["wellfed-predict", "models:/wellfed-classifier@champion",
                           "data/raw/test.tsv", str(out)], cwd=project, env=team_env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import pandas as pd

    assert len(pd.read_parquet(out)) == 60
    proc = subprocess.run(["wellfed-compare", f"sweep:{SWEEP}"], cwd=project, env=team_env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"sweep {SWEEP}: best recipe " in proc.stdout
    assert f"{len(RECIPES) * len(SEEDS)} of {len(RECIPES) * len(SEEDS)} trials evaluated" in \
        proc.stdout
