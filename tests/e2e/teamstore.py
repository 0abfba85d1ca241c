"""A throwaway team store for the e2e tier: PostgreSQL and an MLflow server on it that proxies
the artifacts and asks for a login, started by the same functions as `make team-store`
(scripts/team_store.py), and stopped when the test ends, also when it fails. While it runs, the
tests' MLflow clients (and the stages they start) log in as its admin.

PostgreSQL's folder is a fresh one under /tmp, readable by its user: as root (CI) PostgreSQL
runs as `postgres` (else `nobody`), which cannot enter pytest's private tmp folders. Without
PostgreSQL on this machine the tests skip with one line; under CI (WELLFED_CI=1, set by
.ci/run, which installs PostgreSQL first) they fail instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]


def script():
    """scripts/team_store.py as a module."""
    spec = importlib.util.spec_from_file_location("team_store", PROJECT / "scripts" /
                                                  "team_store.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TeamStore:
    """A running PostgreSQL (`pg`) and MLflow server (`uri`); faults: `restart_server`,
    `restart_postgres`."""

    def __init__(self, folder: Path, workers: int):
        self.ts = script()
        self.folder, self.workers = folder, workers
        self.pg = self.ts.Postgres(folder / "postgres", user=self.ts.pg_user())
        self.port = self.ts.free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.server = None

    def start(self) -> TeamStore:
        self.pg.init()
        self.pg.start()
        self.env = {"PGPASSFILE": str(self.pg.pgpass),
                    **self.ts.store_access.prepare(self.folder)}
        self.start_server()
        self.ts.store_access.set_up_roles(self.uri, self.folder)
        return self

    @property
    def admin(self) -> dict:
        """The admin's login, as MLflow's client takes it from the environment."""
        return self.ts.store_access.as_admin(self.folder)

    def start_server(self) -> None:
        self.server = self.ts.start_server(self.pg.uri, self.folder / "artifacts", "127.0.0.1",
                                           self.port, self.workers, self.folder / "server.log",
                                           env=self.env)

    def restart_server(self, down_s: float = 2.0) -> float:
        """Stop the server, wait `down_s`, start it again on the same port; return how long
        it did not answer."""
        started = time.time()
        self.ts.stop_server(self.server)
        time.sleep(down_s)
        self.start_server()
        return time.time() - started

    def restart_postgres(self) -> float:
        started = time.time()
        self.pg.restart()
        return time.time() - started

    def stop(self) -> None:
        if self.server is not None:
            self.ts.stop_server(self.server)
        self.pg.stop()


def postgres_or_skip() -> None:
    try:
        script().postgres_binaries()
    except Exception as err:
        if os.environ.get("WELLFED_CI"):
            raise
        pytest.skip(f"no PostgreSQL on this machine ({err}): the team store's tests need it")


@contextlib.contextmanager
def team_store(workers: int = 2):
    """A started `TeamStore` in a fresh folder under /tmp, stopped and removed afterwards."""
    postgres_or_skip()
    folder = Path(tempfile.mkdtemp(prefix="wellfed-team-store-"))
    folder.chmod(0o755)  # PostgreSQL's own user must enter it
    store = TeamStore(folder, workers)
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                                            "PGPASSFILE")}
    try:
        store.start()
        os.environ.update({**store.admin, "PGPASSFILE": str(store.pg.pgpass)})
        yield store
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        store.stop()
        shutil.rmtree(folder, ignore_errors=True)
