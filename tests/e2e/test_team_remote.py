"""The shared stores a team moves to (docs/team.md). A DVC remote: Alice runs the pipeline and
pushes (git to a shared repository, the outputs to a folder remote); Bob clones, `dvc pull`s,
and `dvc repro` finds nothing to redo; experiments travel the same way, `dvc exp push` from one
clone, `dvc exp pull` into the other, with their outputs. And Alice's MLflow store (mlflow.db
and mlruns/) moved into a fresh team store by `scripts/team_store.py --import`: her run, its
model and @champion served from there."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.pipeline import PROJECT, env, mlflow_runs, run, tiny_project
from tests.e2e.teamstore import postgres_or_skip, script

pytestmark = pytest.mark.e2e
GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


@pytest.fixture(scope="module")
def alice(tmp_path_factory, tiny_model_dir) -> tuple[Path, Path, str]:
    """Alice's clone after `dvc repro` and `dvc push`, pushed to a shared git repository;
    (clone, the shared repository, what `dvc push` said)."""
    import shutil

    tmp = tmp_path_factory.mktemp("team-remote")
    origin, remote = tmp / "origin.git", tmp / "dvc-remote"
    run(["git", "init", "-q", "--bare", str(origin)], tmp)
    clone = tmp / "alice" / "wellfed"
    clone.mkdir(parents=True)
    tiny_project(clone, tiny_model_dir)
    # The project's own: what a clone lacks (the time reports, checkpoints) is what it ignores.
    shutil.copy(PROJECT / "data" / ".gitignore", clone / "data" / ".gitignore")
    run(["dvc", "remote", "add", "-d", "team", str(remote)], clone)  # in .dvc/config: shared
    run(["dvc", "repro"], clone)
    pushed = run(["dvc", "push"], clone).stdout
    run(["git", "add", "-A"], clone)
    run([*GIT, "commit", "-q", "-m", "pipeline run"], clone)
    run(["git", "remote", "add", "origin", str(origin)], clone)
    run(["git", "push", "-q", "origin", "HEAD:main"], clone)
    return clone, origin, pushed


def test_a_second_clone_pulls_the_pipeline_up_to_date_and_the_experiments(alice, tmp_path):
    alice, origin, pushed = alice
    bob = tmp_path / "bob" / "wellfed"
    run(["git", "clone", "-q", "--branch", "main", str(origin), str(bob)], tmp_path)
    pulled = run(["dvc", "pull"], bob).stdout
    status = run(["dvc", "status"], bob).stdout
    assert "Data and pipelines are up to date" in status, status
    again = run(["dvc", "repro"], bob)
    out = again.stdout + again.stderr
    assert "Running stage" not in out, out[-3000:]  # nothing recomputed
    assert (bob / "data" / "model" / "config.json").is_file()
    assert json.loads((bob / "data" / "eval" / "metrics.json").read_text()) == json.loads(
        (alice / "data" / "eval" / "metrics.json").read_text())
    print(f"\nalice pushed: {pushed.strip().splitlines()[-1]}; bob pulled: "
          f"{pulled.strip().splitlines()[-1]}; bob's dvc repro ran no stage")

    # An experiment: Alice's, pushed with its outputs; Bob pulls it and applies it.
    run(["dvc", "exp", "run", "-n", "alias-best", "-S", "mlflow.champion_alias=best"], alice)
    run(["dvc", "exp", "push", "origin", "alias-best"], alice)
    run(["dvc", "exp", "pull", "origin", "alias-best"], bob)
    shown = json.loads(run(["dvc", "exp", "show", "--json"], bob).stdout)
    names = [exp.get("name") for commit in shown for exp in (commit.get("experiments") or [])]
    assert "alias-best" in names, shown
    run(["dvc", "exp", "apply", "alias-best"], bob)
    status = run(["dvc", "status"], bob).stdout
    assert "Data and pipelines are up to date" in status, status
    params = (bob / "params.yaml").read_text()
    assert "champion_alias: best" in params


def test_a_project_store_moves_into_a_fresh_team_store_whole(alice, tmp_path, monkeypatch):
    """`python scripts/team_store.py --import mlflow.db`: the same run id, every metric value,
    the artifacts served by the server, @champion resolving to the same version, whose files
    download through the server."""
    import tempfile

    import mlflow

    postgres_or_skip()
    alice, _, _ = alice
    client, runs = mlflow_runs(alice)
    before = runs[0]
    champion = client.get_model_version_by_alias("wellfed-classifier", "champion")
    folder = Path(tempfile.mkdtemp(prefix="wellfed-import-"))
    folder.chmod(0o755)  # PostgreSQL's own user must enter it (as root: postgres)
    port = script().free_port()
    log = open(tmp_path / "team-store.log", "w")
    server = subprocess.Popen(["python", str(PROJECT / "scripts" / "team_store.py"),
                               "--dir", str(folder / "s"), "--port", str(port), "--workers", "1",
                               "--import", str(alice / "mlflow.db")], cwd=alice, env=env(),
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while "Ctrl-C stops it" not in (tmp_path / "team-store.log").read_text():
            assert server.poll() is None and time.time() < deadline, \
                (tmp_path / "team-store.log").read_text()[-3000:]
            time.sleep(1)
        uri = f"http://127.0.0.1:{port}"
        for key, value in script().store_access.as_admin(folder / "s").items():
            monkeypatch.setenv(key, value)  # the store asks for a login: its admin's
        # A second one on the same folder is refused in one line naming the first, which goes on
        second = subprocess.run(["python", str(PROJECT / "scripts" / "team_store.py"), "--dir",
                                 str(folder / "s"), "--port", str(script().free_port()),
                                 "--import", str(alice / "mlflow.db")], cwd=alice, env=env(),
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 1 and second.stderr.strip().splitlines() == [
            f"error: {folder / 's'} is in use: its team store runs (pid {server.pid}, server on "
            f"127.0.0.1:{port}); stop it first (Ctrl-C where it runs) or choose another --dir; "
            "nothing was started or stopped"], second.stderr
        moved = mlflow.MlflowClient(uri)
        found = moved.search_runs([moved.get_experiment_by_name("wellfed").experiment_id],
                                  order_by=["start_time ASC"])
        assert [r.info.run_id for r in found] == [r.info.run_id for r in runs]
        after = found[0]
        assert after.info.artifact_uri.startswith("mlflow-artifacts:/")
        assert after.data.metrics == before.data.metrics and after.data.params == before.data.params
        for key in ("train/loss", "val/macro_f1"):
            assert ([(m.step, m.value) for m in moved.get_metric_history(after.info.run_id, key)]
                    == [(m.step, m.value) for m in client.get_metric_history(before.info.run_id,
                                                                             key)])
        assert {f.path for f in moved.list_artifacts(after.info.run_id, "eval")} == {
            f.path for f in client.list_artifacts(before.info.run_id, "eval")}
        there = moved.get_model_version_by_alias("wellfed-classifier", "champion")
        assert (str(there.version), there.run_id, there.tags) == (  # REST gives str, sqlite int
            str(champion.version), champion.run_id, champion.tags)
        # The champion's files come through the server (serving them: tests/e2e/test_team.py).
        # The registry a models:/ URI names, from the environment: MLflow 3.17 looks the alias
        # up in mlflow.get_registry_uri() whatever tracking_uri or registry_uri is passed
        # (ModelsArtifactRepository._get_model_uri_infos), which after other tests of this
        # worker was the default sqlite:///mlflow.db (fresh-check's failure, twice).
        monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)
        got = mlflow.artifacts.download_artifacts("models:/wellfed-classifier@champion",
                                                  dst_path=str(tmp_path / "m"), tracking_uri=uri)
        assert (Path(got) / "MLmodel").is_file()
        assert "moved " in (tmp_path / "team-store.log").read_text()
    finally:
        import os
        import shutil

        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # the script stops its server and PostgreSQL
            server.wait(timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
    print("\n" + next(line for line in (tmp_path / "team-store.log").read_text().splitlines()
                      if line.startswith("[wellfed] moved")))
