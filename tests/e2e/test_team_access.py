"""Who may do what on the team store (docs/team.md#access), against the real thing: the store
conftest.py starts as `make team-store` does (PostgreSQL, MLflow's basic-auth, the roles).

Before: a plain `curl` of any local user created runs and moved @champion, the PostgreSQL
password was in `ps`, the socket trusted a superuser role, and `--import` beside the running
store shut its PostgreSQL down."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.teamstore import PROJECT

pytestmark = pytest.mark.e2e

NO_LOGIN = {"MLFLOW_TRACKING_USERNAME": None, "MLFLOW_TRACKING_PASSWORD": None,
            "MLFLOW_TRACKING_TOKEN": None}


def post(url: str, body: dict, login: tuple[str, str] | None = None) -> int:
    """The HTTP status of a plain POST (what `curl` sends), with or without a login."""
    import base64

    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    if login:
        token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture(scope="module")
def users(store) -> dict[str, tuple[str, str]]:
    """Three accounts made as `--add-user` makes them: a reader, a team member, a champion."""
    made = {}
    for name, roles in (("reader", []), ("member", ["team"]), ("releaser", ["champion"])):
        creds = store.ts.store_access.add_user(store.uri, store.folder, name, roles)
        assert creds.stat().st_mode & 0o777 == 0o600
        section = configparser.ConfigParser()
        section.read(creds)
        made[name] = (name, section["mlflow"]["mlflow_tracking_password"])
    return made


def as_user(monkeypatch, login: tuple[str, str]):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", login[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", login[1])
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    return mlflow.MlflowClient


def test_a_write_without_a_login_is_refused(store):
    """What `curl` did as another local user: now a 401, and nothing was made."""
    api = f"{store.uri}/api/2.0/mlflow"
    assert post(f"{api}/experiments/create", {"name": "anonymous"}) == 401
    assert post(f"{api}/runs/create", {"experiment_id": "0"}) == 401
    assert post(f"{api}/registered-models/alias",
                {"name": "wellfed-classifier", "alias": "champion", "version": "1"}) == 401
    assert post(f"{api}/experiments/create", {"name": "anonymous"},
                ("admin", "not-the-password")) == 401
    import mlflow

    assert mlflow.MlflowClient(store.uri).get_experiment_by_name("anonymous") is None  # as admin


def test_readers_read_the_team_writes_and_only_the_champion_role_moves_champion(
        store, users, monkeypatch):
    from mlflow.exceptions import MlflowException

    client = as_user(monkeypatch, users["member"])(store.uri)
    experiment = client.create_experiment("access-check")
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "eval/macro_f1", 0.5)
    client.log_text(run.info.run_id, "made by the team", "notes/member.txt")  # through the proxy
    client.create_registered_model("access-model")
    version = client.create_model_version("access-model", f"{run.info.artifact_uri}/model",
                                          run_id=run.info.run_id).version
    client.set_registered_model_alias("access-model", "candidate", version)  # any other alias
    with pytest.raises(MlflowException) as refused:
        client.set_registered_model_alias("access-model", "champion", version)
    assert "403" in str(refused.value) and ("@champion moves only for the role 'champion', which "
                                            "user 'member' does not hold") in str(refused.value)

    reader = as_user(monkeypatch, users["reader"])(store.uri)
    assert reader.get_run(run.info.run_id).data.metrics == {"eval/macro_f1": 0.5}
    assert reader.get_model_version("access-model", version).run_id == run.info.run_id
    assert [f.path for f in reader.list_artifacts(run.info.run_id, "notes")] == [
        "notes/member.txt"]
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)  # mlflow-artifacts:/ is the server's
    assert mlflow.artifacts.load_text(f"{run.info.artifact_uri}/notes/member.txt") == \
        "made by the team"  # the reader's login, from the environment
    for write in (lambda: reader.log_metric(run.info.run_id, "eval/macro_f1", 0.9),
                  lambda: reader.log_text(run.info.run_id, "not the team", "notes/reader.txt"),
                  lambda: reader.create_experiment("reader-made"),
                  lambda: reader.set_registered_model_alias("access-model", "champion", version)):
        with pytest.raises(Exception, match="403"):  # an artifact's: requests' HTTPError
            write()

    releaser = as_user(monkeypatch, users["releaser"])(store.uri)
    releaser.set_registered_model_alias("access-model", "champion", version)
    assert releaser.get_model_version_by_alias("access-model", "champion").version == version
    member = as_user(monkeypatch, users["member"])(store.uri)
    with pytest.raises(MlflowException, match="403"):
        member.delete_registered_model_alias("access-model", "champion")
    assert [m.value for m in reader.get_metric_history(run.info.run_id, "eval/macro_f1")] == [0.5]


def test_the_preflight_says_a_missing_or_wrong_login_in_one_line(store, users, monkeypatch,
                                                                 tmp_path):
    """What the train stage checks first (preflight.check_stores): at once, one line each."""
    from wellfed.train.run.preflight import check_stores

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials
    for key in NO_LOGIN:
        monkeypatch.delenv(key, raising=False)
    head = f"mlflow.tracking_uri = {store.uri}: the tracking server"
    with pytest.raises(ValueError) as refused:
        check_stores(store.uri, store.uri, Path("/nonexistent"))
    assert str(refused.value) == (
        f"{head} asks for a login and none is set; export MLFLOW_TRACKING_USERNAME and "
        "MLFLOW_TRACKING_PASSWORD, or put them in ~/.mlflow/credentials (the store's admin "
        "makes accounts: docs/team.md#access); nothing was trained")

    (tmp_path / ".mlflow").mkdir()
    (tmp_path / ".mlflow" / "credentials").write_text(
        "[mlflow]\nmlflow_tracking_username = reader\nmlflow_tracking_password = wrong\n")
    with pytest.raises(ValueError) as refused:
        check_stores(store.uri, store.uri, Path("/nonexistent"))
    assert str(refused.value) == (
        f"{head} refused the login of 'reader' (~/.mlflow/credentials): wrong user name or "
        "password; fix it, or ask the store's admin for an account (docs/team.md#access); "
        "nothing was trained")

    (tmp_path / ".mlflow" / "credentials").write_text(
        f"[mlflow]\nmlflow_tracking_username = reader\n"
        f"mlflow_tracking_password = {users['reader'][1]}\n")
    check_stores(store.uri, store.uri, Path("/nonexistent"))  # a reader passes


def secrets_of(store) -> dict[str, str]:
    return {"the mlflow role's": store.pg.password,
            "the PostgreSQL superuser's": (store.pg.folder / "superuser.password").read_text()
            .strip(),
            "the admin's": store.ts.store_access.admin_password(store.folder)}


def test_no_password_is_on_any_command_line(store):
    """What `ps` shows every user: the argv of every process on this machine, the server's,
    its workers' and PostgreSQL's among them."""
    argvs = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argvs[proc.name] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
            except OSError:
                continue
    ours = [a for a in argvs.values() if str(store.folder) in a or f"--port {store.port}" in a]
    assert len(ours) >= 2, ours  # PostgreSQL and `mlflow server` at least
    assert any("mlflow server" in a and "--app-name basic-auth" in a for a in ours), ours
    for what, secret in secrets_of(store).items():
        shown = [a for a in argvs.values() if secret in a]
        assert not shown, f"{what} password on a command line: {shown}"


def test_postgres_trusts_no_one_and_mlflow_is_not_a_superuser(store):
    import psycopg

    rules = [line.split() for line in (store.pg.data / "pg_hba.conf").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert len(rules) >= 2 and all(rule[-1] == "scram-sha-256" for rule in rules), rules
    with pytest.raises(psycopg.OperationalError, match="password"):  # the socket asks too
        psycopg.connect(host=str(store.pg.sockets), port=store.pg.port, user="mlflow",
                        dbname="mlflow", passfile=os.devnull, connect_timeout=10).close()
    with psycopg.connect(host="127.0.0.1", port=store.pg.port, user="mlflow", dbname="mlflow",
                         passfile=str(store.pg.pgpass), connect_timeout=10) as conn:
        role = conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, "
                            "rolbypassrls FROM pg_roles WHERE rolname = current_user").fetchone()
        owned = conn.execute("SELECT datname FROM pg_database WHERE datdba = "
                             "(SELECT oid FROM pg_roles WHERE rolname = 'mlflow')").fetchall()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
        conn.rollback()
    assert role == (False, False, False, False, False)
    assert owned == [("mlflow",)]


def test_an_import_beside_the_running_store_is_refused_and_stops_nothing(store, tmp_path):
    """The fault of the issue: `--import` into a running store's folder printed `pg_ctl start
    failed` and shut its PostgreSQL down. Now one line naming it, and it still answers."""
    import mlflow

    running = store.pg.running()
    assert running is not None
    (tmp_path / "mlflow.db").touch()
    proc = subprocess.run([sys.executable, str(PROJECT / "scripts" / "team_store.py"), "--dir",
                           str(store.folder), "--port", str(store.ts.free_port()), "--import",
                           str(tmp_path / "mlflow.db")],
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and lines == [
        f"error: {store.folder} is in use: its PostgreSQL runs (pid {running[0]}, port "
        f"{running[1]}) with no team store holding it; stop it (pg_ctl -D {store.pg.data} "
        "stop) or choose another --dir; nothing was started or stopped"], proc.stderr
    assert store.pg.running() == running
    assert mlflow.MlflowClient(store.uri).search_experiments(max_results=1)  # still answers


def test_an_evaluation_without_the_role_scores_its_version_and_one_with_it_moves_champion(
        store, users, monkeypatch, capsys):
    """evaluate's ranking (champion.promote) as a team member: the server refuses the move, the
    stage goes on with one line; the same ranking as the role `champion` moves the alias."""
    from wellfed.track import champion

    member = as_user(monkeypatch, users["member"])(store.uri)
    experiment = member.create_experiment("access-evaluate")
    run = member.create_run(experiment)
    member.create_registered_model("ranked-model")
    version = member.create_model_version("ranked-model", f"{run.info.artifact_uri}/model",
                                          run_id=run.info.run_id).version
    verdict = champion.promote(store.uri, "ranked-model", version, "champion", "eval/macro_f1",
                               0.7, "split-fingerprint", "test")
    assert verdict.holder is None and verdict.line() == (
        "models:/ranked-model@champion is not set: the tracking server refused to move it "
        "(@champion moves only for the role 'champion', which user 'member' does not hold); "
        f"version {version} is scored, and the next evaluation by the role 'champion' ranks it "
        "(or, as one: python -m wellfed.track.champion ranked-model champion)")
    as_user(monkeypatch, users["releaser"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)
    assert champion.main(["ranked-model"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"[wellfed] models:/ranked-model@champion is version {version}")


def test_a_reader_asked_to_train_is_refused_in_one_line_before_any_run(store, users,
                                                                        monkeypatch):
    """The train stage opens its MLflow run before any training (tracking.start_run): a login
    that may only read is one line there, not a traceback after the first step."""
    from wellfed.track import tracking

    client = as_user(monkeypatch, users["reader"])(store.uri)
    with pytest.raises(ValueError) as refused:
        tracking.start_run(store.uri, "reader-run", "r")
    assert str(refused.value) == (
        f"{store.uri}: the tracking server answered 403: 'reader' (MLFLOW_TRACKING_USERNAME) may "
        "not open a run in the experiment 'reader-run' (writes take the role 'team'); ask the "
        "store's admin for access (docs/team.md#access)")
    assert client.get_experiment_by_name("reader-run") is None
