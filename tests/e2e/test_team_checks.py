"""The team store's guards. What the train stage says before any work: the tracking server
down, a wrong PostgreSQL password or database, a DVC remote that takes no files, each one line
naming the setting and the fix. And @champion when two trials finish at the same moment."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.pipeline import env, run

pytestmark = pytest.mark.e2e


def copy_of(project: Path, dest: Path) -> Path:
    """A copy of the tokenized project (without queued trials' workspaces)."""
    import shutil

    shutil.copytree(project, dest, ignore=shutil.ignore_patterns("tmp", "mlflow.db*"))
    return dest


TRAIN = ["python", "stages/train.py", "data/tokens", "data/model", "data/train",
         "data/checkpoints"]


def test_a_server_that_does_not_answer_stops_the_stage_before_any_work(store, tokenized,
                                                                       tmp_path):
    """The tracking server down at the start of a run: one line naming the setting and the fix,
    before the MLflow run or any checkpoint is made."""
    copy = copy_of(tokenized, tmp_path / "p")
    uri = f"http://127.0.0.1:{store.ts.free_port()}"
    started = time.time()
    proc = subprocess.run(TRAIN, cwd=copy, env={**env(), "MLFLOW_TRACKING_URI": uri,
                                                "WELLFED_TRACKING_WAIT_S": "2"},
                          capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last == (
        f"error: $MLFLOW_TRACKING_URI = {uri}: the tracking server does not answer (connection "
        "refused); start it (`make team-store`, docs/team.md) or unset MLFLOW_TRACKING_URI or "
        "point it at the server; nothing was trained"), last
    assert "no answer yet (connection refused); waiting up to 2 s" in proc.stdout
    assert not (copy / "data" / "model").exists()
    assert not list((copy / "data" / "checkpoints").glob("wf-*"))
    print(f"\nthe server down at the start: one line in {time.time() - started:.1f} s "
          "(the stage's start and a 2 s wait), nothing made")


def test_a_wrong_password_or_database_is_one_line_without_the_password(store, monkeypatch):
    """What the train stage checks first (preflight.check_stores), against the real PostgreSQL:
    a wrong password and a missing database, at once (no wait), the password never shown."""
    from wellfed.train.run.preflight import check_stores

    pg = store.pg
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(pg.pgpass))  # the right password, for the last check
    cases = {pg.uri.replace("mlflow@", "mlflow:not-the-password@"):
             "the database refused user 'mlflow' (wrong password); fix the password in the URI "
             "(postgresql://USER:PASSWORD@HOST:PORT/DB); nothing was trained",
             pg.uri.replace("mlflow@", f"mlflow:{pg.password}@").rsplit("/", 1)[0] + "/nosuchdb":
             "no database 'nosuchdb' on that server; create it (`createdb nosuchdb`) or name an "
             "existing one in the URI; nothing was trained"}
    for uri, said in cases.items():
        started = time.time()
        with pytest.raises(ValueError) as refused:
            check_stores(uri, uri, Path("/nonexistent"))
        line = str(refused.value)
        assert line.startswith("mlflow.tracking_uri = postgresql+psycopg://mlflow:***@") and \
            line.endswith(said), line
        assert pg.password not in line and "not-the-password" not in line
        assert time.time() - started < 30  # refused at once: nothing to wait for
    check_stores(pg.uri, pg.uri, Path("/nonexistent"))  # the right one (from pgpass) answers


def test_a_dvc_remote_that_takes_no_files_stops_the_stage_before_any_work(tokenized, tmp_path):
    from tests.conftest import read_only

    copy = copy_of(tokenized, tmp_path / "p")
    remote = tmp_path / "remote"
    remote.mkdir()
    run(["dvc", "remote", "add", "-d", "team", str(remote)], copy)
    with read_only(remote):
        proc = subprocess.run(TRAIN, cwd=copy,
                              env={**env(), "MLFLOW_TRACKING_URI": f"sqlite:///{copy}/m.db"},
                              capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert last.startswith(f"error: the DVC remote 'team' (core.remote; remote.team.url = "
                           f"{remote}) does not take files"), last
    assert "dvc remote modify team url" in last and last.endswith("nothing was trained")
    assert not (copy / "data" / "model").exists() and not (copy / "m.db").exists()


PROMOTE = """
import sys, time
from wellfed.track import champion
uri, start, spacing = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
for round_, job in enumerate(sys.argv[4:]):
    name, version, value = job.split(":")
    time.sleep(max(start + round_ * spacing - time.time(), 0))  # both decide at this instant
    print(champion.promote(uri, name, version, "champion", "eval/macro_f1", float(value),
                           "split-fingerprint", "test").line(), flush=True)
"""
ROUNDS = 6


def test_two_trials_finishing_at_the_same_moment_leave_champion_on_the_better(store):
    """Two evaluate stages (two processes, as on two nodes) rank their versions through the
    server at the same instant, 6 times over, the order of the two swapped every round:
    @champion ends on the better one every time, and each version's reason says what it is.
    Before the ranking lock (track/registry.py) the first round already failed: both versions
    said they took @champion from no version."""
    import sys

    import mlflow

    client = mlflow.MlflowClient(store.uri)
    experiment = client.create_experiment("simultaneous")
    jobs: list[list[str]] = [[], []]
    pairs = []
    for round_ in range(ROUNDS):
        name = f"simultaneous-{round_}"
        client.create_registered_model(name)
        runs = [client.create_run(experiment).info.run_id for _ in range(2)]
        better, worse = (client.create_model_version(name, f"runs:/{run_id}/model", run_id)
                         for run_id in runs)
        first, second = (better, "0.91"), (worse, "0.87")
        if round_ % 2:  # the other process gets the better one
            first, second = second, first
        for job, (version, value) in zip(jobs, (first, second)):
            job.append(f"{name}:{version.version}:{value}")
        pairs.append((name, better.version, worse.version))
    start = time.time() + 15  # both processes are up and have imported MLflow by then
    procs = [subprocess.Popen([sys.executable, "-c", PROMOTE, store.uri, str(start), "2",
                               *job], env=env(), stdout=subprocess.PIPE, text=True)
             for job in jobs]
    lines = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs), lines
    assert time.time() < start + ROUNDS * 2 + 60, "the processes started late: no overlap"
    held = 0
    for round_, (name, better, worse) in enumerate(pairs):
        champion = client.get_model_version_by_alias(name, "champion")
        tags = {v: client.get_model_version(name, v).tags for v in (better, worse)}
        reasons = {v: t["wellfed.champion.reason"] for v, t in tags.items()}
        held += champion.version == better
        assert champion.version == better, (round_, lines, reasons)
        assert reasons[better].startswith("@champion: eval/macro_f1 0.9100 on the test"), reasons
        # The worse one either never took the alias, or held it first and was beaten: either
        # way the two reasons tell one story.
        if reasons[worse].startswith("@champion: "):
            assert tags[better]["wellfed.champion.previous"] == worse and reasons[better].endswith(
                f"beats version {worse}'s 0.8700 on the same split"), reasons
        else:
            assert reasons[worse].startswith(
                "not @champion: scored eval/macro_f1 0.8700 on the test split, not above version "
                f"{better}'s 0.9100"), reasons
    assert not [m.name for m in client.search_registered_models() if m.name.endswith(".lock")]
    print(f"\ntwo versions ranked at the same instant, {ROUNDS} times: @champion on the better "
          f"one {held} times of {ROUNDS}, each with its reason")
