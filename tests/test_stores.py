"""Before any work, the stores a run writes to answer (track/stores.py, train/run/preflight.py): one
line naming the setting and the fix otherwise. A real PostgreSQL refusing a password or a
database is tests/e2e/test_team_checks.py; here, what needs no server."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from tests.conftest import read_only
from wellfed.track import stores
from wellfed.train.run.preflight import check_remote, check_stores


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_a_password_is_never_shown():
    assert stores.shown("postgresql+psycopg://mlflow:s3cret@db:5432/mlflow") == \
        "postgresql+psycopg://mlflow:***@db:5432/mlflow"
    assert stores.shown("http://mlflow.example.com:5000") == "http://mlflow.example.com:5000"
    line = stores.database_line("postgresql://bob:s3cret@db/mlflow", "mlflow.tracking_uri",
                                'FATAL:  password authentication failed for user "bob"')
    assert "s3cret" not in line and "wrong password" in line


def test_the_setting_named_is_the_one_in_force(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert stores.setting("http://x:5000") == "mlflow.tracking_uri"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://y:5000")
    assert stores.setting("http://x:5000") == "$MLFLOW_TRACKING_URI"


def test_a_server_that_does_not_answer_is_one_line_after_its_wait(monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(stores.WAIT_ENV, "1")
    uri = f"http://127.0.0.1:{dead_port()}"
    with pytest.raises(ValueError) as refused:
        check_stores(uri, uri, __import__("pathlib").Path("/nonexistent"))
    assert str(refused.value) == (
        f"mlflow.tracking_uri = {uri}: the tracking server does not answer (connection refused); "
        "start it (`make team-store`, docs/team.md) or fix mlflow.tracking_uri in params.yaml, "
        "or set it to \"\" for the project's sqlite store; nothing was trained")
    waited = capsys.readouterr().out
    assert waited.startswith(f"[wellfed] mlflow.tracking_uri = {uri}: no answer yet (connection "
                             "refused); waiting up to 1 s (WELLFED_TRACKING_WAIT_S)"), waited


def test_a_host_that_does_not_resolve_is_not_waited_for(monkeypatch):
    monkeypatch.setenv(stores.WAIT_ENV, "60")
    started = time.time()
    with pytest.raises(ValueError, match=r"does not answer \(no such host\)"):
        stores.check_store("http://no-such-host.invalid:5000", "mlflow.tracking_uri")
    assert time.time() - started < 30  # the resolver's time, not the 60 s wait


def test_what_a_restarting_store_answers_is_waited_for_and_a_refusal_is_not():
    assert stores.transient("HTTPConnectionPool(...): Failed to establish a new connection: "
                            "[Errno 111] Connection refused")
    assert stores.transient("INTERNAL_ERROR: (psycopg.OperationalError) server closed the "
                            "connection unexpectedly")
    assert not stores.transient('FATAL:  password authentication failed for user "mlflow"')
    assert not stores.transient('FATAL:  database "nosuchdb" does not exist')
    assert not stores.transient("Failed to resolve 'x.invalid' (Name or service not known)")


def test_local_stores_are_the_preflight_folders_not_probed():
    for uri in ("sqlite:////nonexistent/mlflow.db", "file:///nonexistent/mlruns", ""):
        stores.check_store(uri, "mlflow.tracking_uri")  # nothing to reach: no error


@pytest.fixture
def repo(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["dvc", "init", "-q"], cwd=tmp_path, check=True)
    return tmp_path


def test_a_dvc_remote_folder_that_takes_no_files_is_one_line(repo, tmp_path_factory):
    remote = tmp_path_factory.mktemp("remote")
    check_remote(repo)  # no remote: nothing to check
    subprocess.run(["dvc", "remote", "add", "-d", "team", str(remote / "cache")], cwd=repo,
                   check=True)
    check_remote(repo)  # not there yet: its parent takes files, `dvc push` makes it
    with read_only(remote):
        with pytest.raises(ValueError) as refused:
            check_remote(repo)
    assert str(refused.value).startswith(
        f"the DVC remote 'team' (core.remote; remote.team.url = {remote / 'cache'}) does not "
        f"take files ({remote}: ")
    assert str(refused.value).endswith(
        "`dvc push` would fail after training; make it writable, point it elsewhere (`dvc remote "
        "modify team url <folder>`), or train without a default remote in this clone (`dvc "
        "config --local core.remote \"\"`); nothing was trained")
    subprocess.run(["dvc", "config", "--local", "core.remote", ""], cwd=repo, check=True)
    with read_only(remote):
        check_remote(repo)  # the clone's own way out


def test_a_remote_elsewhere_is_dvcs_to_check(repo):
    subprocess.run(["dvc", "remote", "add", "-d", "s3", "s3://bucket/cache"], cwd=repo,
                   check=True)
    check_remote(repo)  # its credentials are dvc's: no probe, no error
