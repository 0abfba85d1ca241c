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


def login_env(monkeypatch, tmp_path, user=None, password=None, file=None):
    monkeypatch.setenv("HOME", str(tmp_path))  # ~/.mlflow/credentials here
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    if user:
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    if password:
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    if file:
        (tmp_path / ".mlflow").mkdir()
        (tmp_path / ".mlflow" / "credentials").write_text(file)


UNAUTHORIZED = ("API request to endpoint /api/2.0/mlflow/experiments/search failed with error "
                "code 401 != 200. Response body: 'You are not authenticated.'")
FORBIDDEN = "API request ... failed with error code 403 != 200. Response body: 'Permission denied'"


def test_a_missing_login_is_said_with_where_to_set_one(monkeypatch, tmp_path):
    login_env(monkeypatch, tmp_path)
    assert stores.server_line("http://x:5000", "mlflow.tracking_uri", UNAUTHORIZED) == (
        "mlflow.tracking_uri = http://x:5000: the tracking server asks for a login and none is "
        "set; export MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or put them in "
        "~/.mlflow/credentials (the store's admin makes accounts: docs/team.md#access)")
    login_env(monkeypatch, tmp_path / "u", user="ann")
    assert "and 'ann' (MLFLOW_TRACKING_USERNAME) has no password;" in stores.server_line(
        "http://x:5000", "mlflow.tracking_uri", UNAUTHORIZED)


def test_a_wrong_login_names_the_user_and_where_it_came_from_never_the_password(monkeypatch,
                                                                                tmp_path):
    login_env(monkeypatch, tmp_path, file="[mlflow]\nmlflow_tracking_username = bob\n"
                                          "mlflow_tracking_password = s3cret\n")
    line = stores.server_line("http://x:5000", "$MLFLOW_TRACKING_URI", UNAUTHORIZED)
    assert line == ("$MLFLOW_TRACKING_URI = http://x:5000: the tracking server refused the login "
                    "of 'bob' (~/.mlflow/credentials): wrong user name or password; fix it, or "
                    "ask the store's admin for an account (docs/team.md#access)")
    login_env(monkeypatch, tmp_path / "v", user="carol", password="s3cret")
    line = stores.server_line("http://x:5000", "mlflow.tracking_uri", FORBIDDEN)
    assert line == ("mlflow.tracking_uri = http://x:5000: the tracking server answered 403: "
                    "'carol' (MLFLOW_TRACKING_USERNAME) may not read its runs; ask the store's "
                    "admin for access (docs/team.md#access)")
    assert not stores.transient(UNAUTHORIZED) and not stores.transient(FORBIDDEN)


class Request:
    """What the server's authorization function reads of a Flask request."""

    def __init__(self, method, path, body=None, args=None):
        self.method, self.path, self.body, self.args = method, path, body, args or {}

    def get_json(self, silent=False):
        return self.body


def test_the_store_knows_an_alias_move_and_a_create_on_every_route():
    from wellfed.track.store_access import creates, moved_alias

    api, ajax = "/api/2.0/mlflow", "/ajax-api/2.0/mlflow"
    moves = [Request("POST", f"{api}/registered-models/alias", {"alias": "champion"}),
             Request("DELETE", f"{ajax}/registered-models/alias", None, {"alias": "champion"}),
             Request("DELETE", f"{api}/registered-models/alias", {"alias": "champion"})]
    assert [moved_alias(r) for r in moves] == ["champion"] * 3
    assert moved_alias(Request("GET", f"{api}/registered-models/alias",
                               None, {"alias": "champion"})) is None
    assert moved_alias(Request("POST", f"{api}/runs/create", {"alias": "champion"})) is None
    assert [creates(Request("POST", f"{p}/{what}/create")) for p in (api, ajax)
            for what in ("experiments", "registered-models")] == [
        "experiment", "registered model"] * 2
    assert creates(Request("POST", f"{api}/runs/create")) is None


def test_a_run_the_server_refuses_to_open_is_one_line_naming_the_login(monkeypatch, tmp_path):
    login_env(monkeypatch, tmp_path, user="ops", password="x")
    assert stores.write_refusal("http://x:5000", "wellfed", FORBIDDEN) == (
        "http://x:5000: the tracking server answered 403: 'ops' (MLFLOW_TRACKING_USERNAME) may "
        "not open a run in the experiment 'wellfed' (writes take the role 'team'); ask the "
        "store's admin for access (docs/team.md#access)")
    assert stores.write_refusal("http://x:5000", "wellfed", "RESOURCE_DOES_NOT_EXIST") is None


def test_a_store_moved_into_the_team_store_is_set_aside_and_says_where_it_went(tmp_path,
                                                                              monkeypatch):
    from wellfed.track import store_move
    from wellfed.track.tracking import tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"runs")
    (tmp_path / "mlflow.db-wal").write_bytes(b"wal")
    assert tracking_uri("", tmp_path) == f"sqlite:///{db}"
    kept = store_move.mark_moved(db, "http://127.0.0.1:5000")
    assert kept.read_bytes() == b"runs" and (tmp_path / "mlflow.db.moved-wal").is_file()
    assert not db.exists()  # nothing lost: set aside, not deleted
    with pytest.raises(ValueError) as said:
        tracking_uri("", tmp_path)
    line = str(said.value)
    assert "\n" not in line and "moved into the team store at http://127.0.0.1:5000" in line
    assert "export MLFLOW_TRACKING_URI=http://127.0.0.1:5000" in line
    # the variable (or params) wins, as before
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri("", tmp_path) == "http://127.0.0.1:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    (tmp_path / "mlflow.db.moved-to").unlink()  # asked for a new local store: allowed again
    assert tracking_uri("", tmp_path) == f"sqlite:///{db}"


def test_every_command_that_opens_the_projects_store_refuses_a_moved_one(tmp_path, monkeypatch,
                                                                       capsys):
    """wellfed-predict models:/..., wellfed-compare, `make ui` (runs_view, then the server) and
    runs_view alone resolve the project's store as the stages do: one line naming the team
    store, exit 1, and no new, empty mlflow.db beside the moved one (it would switch the
    stages' guard off)."""
    import re

    from tests.conftest import PROJECT
    from wellfed.compare import command as compare_command
    from wellfed.compare.prediction_sources import default_tracking_uri
    from wellfed.track import runs_view, store_move
    from wellfed.use.registered import model_folder, store_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"runs")
    store_move.mark_moved(db, "http://127.0.0.1:5000")
    said = "mlflow.db was moved into the team store at http://127.0.0.1:5000"
    explicit = f"sqlite:///{db}"  # as `make ui` passes it, and docs/model.md exports it
    for resolve in (lambda: store_uri(tmp_path), lambda: default_tracking_uri(None, tmp_path),
                    lambda: default_tracking_uri(explicit, tmp_path)):
        with pytest.raises(ValueError, match=said):
            resolve()
    with pytest.raises(ValueError, match=said):
        with model_folder("models:/wellfed-classifier@champion", tmp_path):
            pass
    assert compare_command.main(["run-a", "run-b"]) == 1
    assert said in capsys.readouterr().err
    for argv in ([explicit], []):
        with pytest.raises(SystemExit) as exit_:
            runs_view.main(argv)
        assert exit_.value.code != 0 and said in str(exit_.value.code)
        assert "\n" not in str(exit_.value.code)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", explicit)
    with pytest.raises(ValueError, match=said):
        store_uri(tmp_path)
    assert not db.exists()  # nothing opened it
    # `make ui` checks the store it serves before the server can make it
    recipe = re.search(r"^ui:.*\n((?:\t.*\n)+)", (PROJECT / "Makefile").read_text(), re.M)
    lines = [line for line in recipe.group(1).splitlines() if "sqlite:///" in line]
    assert len(lines) == 2 and "wellfed.track.runs_view sqlite:///$(CURDIR)/mlflow.db" in \
        lines[0] and "mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db" in lines[1]


def test_the_servers_auth_config_checks_a_login_once_a_minute_and_lets_no_login_write(
        tmp_path, monkeypatch):
    """The team store's basic_auth.ini as MLflow's server reads it: READ for users without a
    grant, wellfed's authorization function, and MLflow's login cache on (a scrypt check per
    request cost the server most of its CPU)."""
    from mlflow.server.auth.config import read_auth_config

    from wellfed.track import store_access

    env = store_access.prepare(tmp_path)
    assert (tmp_path / "auth").stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", env["MLFLOW_AUTH_CONFIG_PATH"])
    config = read_auth_config()
    assert config.default_permission == "READ"
    assert config.authorization_function == "wellfed.track.store_access:authenticate"
    assert config.auth_cache_ttl_seconds == store_access.AUTH_CACHE_S == 60
