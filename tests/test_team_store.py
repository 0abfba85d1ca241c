"""scripts/team_store.py's guards that need no PostgreSQL: one owner per store folder, refused in
one line naming the running one with nothing stopped; a password on no command line; a store
made before the lock-down refused. The real store: tests/e2e/test_team_access.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "team_store.py"


@pytest.fixture(scope="module")
def ts():
    spec = importlib.util.spec_from_file_location("team_store_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_folder_held_by_a_running_store_is_refused_naming_it(ts, tmp_path):
    """The lock is an flock: a second process on the folder is refused in one line, the first
    goes on holding it."""
    (tmp_path / "owner").write_text("pid 4242, server on 127.0.0.1:5000\n")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
        "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)"),
        str(tmp_path / "owner.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(tmp_path), "--import",
                               str(tmp_path / "mlflow.db")], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "PATH": os.environ["PATH"]})
        assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
            f"error: {tmp_path} is in use: its team store runs (pid 4242, server on "
            "127.0.0.1:5000); stop it first (Ctrl-C where it runs) or choose another --dir; "
            "nothing was started or stopped"], proc.stderr
        assert holder.poll() is None  # nothing was stopped
        assert not (tmp_path / "postgres").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_postgres_or_server_left_running_is_named_and_left_alone(ts, tmp_path):
    """A store whose owner was killed: its PostgreSQL (postmaster.pid) or server (server.pid)
    still runs. Here both name this test's own process, which must survive the refusal."""
    data = tmp_path / "postgres" / "data"
    data.mkdir(parents=True)
    (data / "postmaster.pid").write_text(f"{os.getpid()}\n{data}\n1700000000\n54321\n")
    pg = ts.Postgres(tmp_path / "postgres", port=54321)
    with pytest.raises(ts.StoreError) as refused:
        ts.claim(tmp_path, pg)
    assert str(refused.value) == (
        f"{tmp_path} is in use: its PostgreSQL runs (pid {os.getpid()}, port 54321) with no "
        f"team store holding it; stop it (pg_ctl -D {data} stop) or choose another --dir; "
        "nothing was started or stopped")
    (data / "postmaster.pid").unlink()
    (tmp_path / "server.pid").write_text(f"pid={os.getpid()} port=5000\n")
    with pytest.raises(ts.StoreError, match=rf"its MLflow server runs \(pid={os.getpid()} "
                                            rf"port=5000\) with no team store holding it"):
        ts.claim(tmp_path, pg)
    (tmp_path / "server.pid").write_text("pid=999999999 port=5000\n")  # gone: a stale file
    lock = ts.claim(tmp_path, pg)
    lock.close()


def test_a_password_in_the_database_uri_is_refused_before_anything_starts(ts, tmp_path, capsys):
    assert ts.main(["--dir", str(tmp_path / "s"),
                    "--pg-uri", "postgresql+psycopg://mlflow:s3cret@db:5432/mlflow"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --pg-uri postgresql+psycopg://mlflow:***@db:5432/mlflow: a "
                          "password in the URI is on the command line") and "s3cret" not in err
    assert not (tmp_path / "s").exists()
    with pytest.raises(ts.StoreError, match="would be on the server's command line"):
        ts.start_server("postgresql+psycopg://mlflow:s3cret@db/mlflow", tmp_path / "a",
                        "127.0.0.1", 1)


def test_a_store_made_before_the_lock_down_is_refused_in_one_line(ts, tmp_path):
    data = tmp_path / "postgres" / "data"
    data.mkdir(parents=True)
    (data / "PG_VERSION").write_text("15\n")
    with pytest.raises(ts.StoreError, match="made by an earlier wellfed: its role `mlflow` is a "
                                            "superuser and its socket trusts any local user"):
        ts.Postgres(tmp_path / "postgres", port=5432).init()


def test_a_user_name_that_would_leave_the_credentials_folder_is_refused(ts, tmp_path, capsys):
    assert ts.main(["--dir", str(tmp_path), "--add-user", "../../etc/x", "--role", "team"]) == 1
    assert capsys.readouterr().err == (
        "error: --add-user '../../etc/x': a user name is 1 to 64 letters, digits and . _ @ -, "
        "starting with a letter or digit; choose one such\n")
    assert list(tmp_path.iterdir()) == []


class Started(Exception):
    """Raised by the Popen stand-in: what start_server would have run is in `env`."""

    def __init__(self, env):
        self.env = env


@pytest.mark.parametrize("user, runs", [(None, "false"), ("true", "true")])
def test_the_server_starts_without_mlflows_job_runner_unless_the_user_asks(ts, tmp_path,
                                                                          monkeypatch, user, runs):
    real = subprocess.Popen

    def popen(cmd, **kwargs):  # the server's start only (an import may start a process)
        if cmd[1:4] == ["-m", "mlflow", "server"]:
            raise Started(kwargs["env"])
        return real(cmd, **kwargs)

    if user is None:
        monkeypatch.delenv(ts.JOBS, raising=False)
    else:
        monkeypatch.setenv(ts.JOBS, user)
    monkeypatch.setattr(ts.subprocess, "Popen", popen)
    with pytest.raises(Started) as started:
        ts.start_server("sqlite:///x.db", tmp_path / "a", "127.0.0.1", 1)
    assert started.value.env[ts.JOBS] == runs


def test_a_tls_proxys_host_name_is_let_in_by_option_or_environment(ts, monkeypatch):
    """docs/team.md's TLS proxy passes the client's Host (mlflow.example.com) on: MLflow's host
    check answered it 403, and --allowed-hosts was set by the script with no way to add one."""
    from mlflow.server.security_utils import get_default_allowed_hosts

    assert ts.allowed_hosts("127.0.0.1") == get_default_allowed_hosts()
    assert ts.allowed_hosts("127.0.0.1", ["mlflow.example.com"])[-2:] == [
        "mlflow.example.com", "mlflow.example.com:*"]
    assert ts.parse(["--allowed-host", "a.example", "--allowed-host", "b.example"]).hosts == [
        "a.example", "b.example"]
    monkeypatch.setenv("TEAM_STORE_ALLOWED_HOSTS", "mlflow.example.com, other.example")
    assert [h.strip() for h in ts.parse([]).hosts] == ["mlflow.example.com", "other.example"]


def test_make_ui_and_make_team_store_start_mlflow_without_its_job_runner(ts):
    makefile = (SCRIPT.parents[1] / "Makefile").read_text()
    assert f"\nexport {ts.JOBS} ?= false\n" in makefile


def test_logins_are_off_only_when_asked_for_by_name(ts, monkeypatch):
    """Auth is the default wherever the server listens; --no-auth-i-know or TEAM_STORE_NO_AUTH=1
    (make team-store's) turns it off, and nothing else does."""
    monkeypatch.delenv("TEAM_STORE_NO_AUTH", raising=False)
    assert not ts.parse(["--host", "0.0.0.0"]).no_auth
    assert ts.parse(["--no-auth-i-know"]).no_auth
    for value, off in (("1", True), ("true", False), ("0", False)):
        monkeypatch.setenv("TEAM_STORE_NO_AUTH", value)
        assert ts.parse(["--host", "0.0.0.0"]).no_auth is off
