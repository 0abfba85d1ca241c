"""A throwaway team store for the e2e tier: PostgreSQL and an MLflow server on it that proxies
the artifacts, started by the same functions as `make team-store` (scripts/team_store.py), and
stopped when the test ends, also when it fails.

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
        self.start_server()
        return self

    def start_server(self) -> None:
        self.server = self.ts.start_server(self.pg.uri, self.folder / "artifacts", "127.0.0.1",
                                           self.port, self.workers, self.folder / "server.log")

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
    try:
        yield store.start()
    finally:
        store.stop()
        shutil.rmtree(folder, ignore_errors=True)
