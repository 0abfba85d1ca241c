"""The team store: an MLflow tracking server on PostgreSQL that proxies its artifacts, so that
every node of a Ray cluster and every clone of the project records into one place without a
shared filesystem (docs/team.md).

    python scripts/team_store.py [--dir .team-store] [--host 127.0.0.1] [--port 5000]
                                 [--pg-uri postgresql://USER:PASSWORD@HOST:PORT/DB]
    make team-store                          # the same, with the defaults

Without --pg-uri it keeps a PostgreSQL of its own under --dir: made on the first start (initdb,
a role and a database both named `mlflow`, a random password in <dir>/postgres/password), on a
loopback port recorded in <dir>/postgres/port, so the URI stays the same across restarts. With
--pg-uri it uses that database (checked first: a wrong password or database is one line). The
server stores artifacts under <dir>/artifacts and serves them (`--serve-artifacts`): clients
upload and download through it. It runs in the foreground and prints the tracking URI to set;
Ctrl-C or SIGTERM stops the server and the PostgreSQL it started.

PostgreSQL refuses to run as root: as root, its commands run as the user `postgres` (the OS
package makes it), else `nobody`, through `runuser`, and its folder is given to that user.

The functions here are what the e2e tests start and stop (tests/e2e/teamstore.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:  # run from a clone without `pip install -e .`
    sys.path.insert(0, str(SRC))

from wellfed.track.store_copy import copy_store  # noqa: E402
from wellfed.track.stores import check_database, shown  # noqa: E402

ROLE = DATABASE = "mlflow"


class StoreError(Exception):
    """One line for the user: what went wrong and the fix."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_user() -> str | None:
    """The user PostgreSQL's commands run as: None = this one; root's: postgres, else nobody."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise StoreError("PostgreSQL refuses to run as root and this machine has neither a "
                     "`postgres` nor a `nobody` user: run as a normal user, or pass --pg-uri")


def as_user(cmd: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


def postgres_binaries() -> None:
    """PostgreSQL's programs on PATH; Debian's package keeps them off it, in
    /usr/lib/postgresql/<version>/bin: the newest such folder is added when needed."""
    if shutil.which("initdb") is None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                       key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
        if found:
            os.environ["PATH"] = f"{found[-1].parent}{os.pathsep}{os.environ.get('PATH', '')}"
    missing = [b for b in ("initdb", "pg_ctl", "createdb") if shutil.which(b) is None]
    if missing:
        raise StoreError(f"PostgreSQL's {', '.join(missing)} not found on PATH: install "
                         "PostgreSQL (Debian/Ubuntu: `apt-get install postgresql`; its binaries "
                         "live in /usr/lib/postgresql/<version>/bin), or pass --pg-uri to use "
                         "an existing server")


def owned_by(path: Path, user: str | None) -> Path:
    """`path` (made if absent) given to `user`, who must also reach it: a folder under a
    private one (root's home, a 0700 temporary folder) is out of its reach."""
    path.mkdir(parents=True, exist_ok=True)
    if user:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
        if subprocess.run(as_user(["test", "-w", str(path)], user)).returncode:
            raise StoreError(f"PostgreSQL runs as the user '{user}' here (it refuses root) and "
                             f"cannot reach {path}: a folder above it is private; choose a "
                             "--dir it can reach (e.g. under /srv or /tmp), or pass --pg-uri")
    return path


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise StoreError(f"{what} failed: {lines[-1] if lines else proc.returncode}")


class Postgres:
    """A PostgreSQL cluster in `folder` (data, socket, log, password, port), run as `user`."""

    def __init__(self, folder: Path, port: int | None = None, user: str | None = None):
        self.folder, self.user = folder.resolve(), user
        self.data, self.sockets = self.folder / "data", self.folder / "sockets"
        recorded = self.folder / "port"
        self.port = port or (int(recorded.read_text()) if recorded.is_file() else free_port())

    @property
    def password(self) -> str:
        return (self.folder / "password").read_text().strip()

    @property
    def uri(self) -> str:
        # +psycopg: the driver pyproject installs, whatever SQLAlchemy takes plain postgresql:// for
        # (psycopg 3 from SQLAlchemy 2.1 on, psycopg2 before)
        return f"postgresql+psycopg://{ROLE}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"

    def init(self) -> None:
        """initdb (once): role `mlflow` with a random password for TCP, trust on the socket."""
        if (self.data / "PG_VERSION").is_file():
            return
        postgres_binaries()
        owned_by(self.folder, self.user)
        secret = self.folder / "password"
        secret.write_text(secrets.token_hex(16) + "\n")
        secret.chmod(0o600)
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(secret, entry.pw_uid, entry.pw_gid)
        _run(as_user(["initdb", "-D", str(self.data), "-U", ROLE, "-A", "scram-sha-256",
                      "--auth-local=trust", f"--pwfile={secret}", "-E", "UTF8",
                      "--no-instructions"], self.user), "initdb")
        (self.folder / "port").write_text(f"{self.port}\n")

    def start(self) -> None:
        """Start on 127.0.0.1:port (socket in `sockets`); make the database on the first start."""
        postgres_binaries()
        owned_by(self.sockets, self.user)
        _run(as_user(["pg_ctl", "-D", str(self.data), "-l", str(self.folder / "log"), "-w",
                      "-t", "60", "-o", self.options(), "start"], self.user), "pg_ctl start")
        made = subprocess.run(as_user(["createdb", "-h", str(self.sockets), "-p", str(self.port),
                                       "-U", ROLE, DATABASE], self.user),
                              capture_output=True, text=True)
        if made.returncode and "already exists" not in made.stderr:
            raise StoreError(f"createdb failed: {made.stderr.strip()}")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").is_file():
            subprocess.run(as_user(["pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60",
                                    "stop"], self.user), capture_output=True)

    def restart(self) -> None:
        _run(as_user(["pg_ctl", "-D", str(self.data), "-l", str(self.folder / "log"), "-m",
                      "fast", "-w", "-t", "60", "-o", self.options(), "restart"], self.user),
             "pg_ctl restart")

    def options(self) -> str:
        """postgres' own options: loopback only, on `port`, its socket in `sockets` (not
        /var/run/postgresql, which a system PostgreSQL owns)."""
        return f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1"


def allowed_hosts(host: str) -> list[str]:
    """The Host headers the server answers. MLflow's default is loopback and private IPs, so a
    client that names this machine (http://mlflow-host:5000) would be refused: when it listens
    beyond loopback, this machine's names are added."""
    from mlflow.server.security_utils import get_default_allowed_hosts

    names = {socket.gethostname(), socket.getfqdn()} if host not in ("127.0.0.1", "localhost",
                                                                   "::1") else set()
    return get_default_allowed_hosts() + [f"{name}:*" for name in sorted(names)]


def start_server(backend: str, artifacts: Path, host: str, port: int, workers: int = 4,
                 log: Path | None = None, timeout: float = 120) -> subprocess.Popen:
    """`mlflow server` on `backend`, proxying artifacts stored in `artifacts`, in a session of
    its own (so its workers stop with it); returns once it answers /health."""
    artifacts.mkdir(parents=True, exist_ok=True)
    out = open(log, "a") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
         "--artifacts-destination", str(artifacts.resolve()), "--serve-artifacts",
         "--host", host, "--port", str(port), "--workers", str(workers),
         "--allowed-hosts", ",".join(allowed_hosts(host))],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"})
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/health"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = log.read_text().strip().splitlines()[-1:] if log else []
            raise StoreError(f"mlflow server exited ({proc.returncode}): "
                             f"{tail[0] if tail else 'see its output'}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return proc
        time.sleep(0.3)
    stop_server(proc)
    raise StoreError(f"mlflow server did not answer {url} within {timeout:g} s")


def stop_server(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM to the server's session (its workers too), SIGKILL after `timeout` s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=".team-store", type=Path,
                        help="its PostgreSQL (without --pg-uri), artifacts and logs")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the server's interface: 0.0.0.0 for other machines (default "
                             "127.0.0.1, this one only)")
    parser.add_argument("--port", default=5000, type=int)
    parser.add_argument("--workers", default=4, type=int, help="server worker processes")
    parser.add_argument("--pg-uri", default="",
                        help="an existing PostgreSQL database (postgresql+psycopg://USER:"
                             "PASSWORD@HOST:PORT/DB) instead of one of its own")
    parser.add_argument("--import", dest="source", type=Path,
                        help="move a project's store (its mlflow.db, with the mlruns/ beside "
                             "it) into this one, fresh, before the server starts (docs/team.md)")
    args = parser.parse_args(argv)
    folder = args.dir.resolve()
    postgres = None
    try:
        if args.pg_uri:
            backend = args.pg_uri
        else:
            postgres = Postgres(folder / "postgres", user=pg_user())
            postgres.init()
            postgres.start()
            backend = postgres.uri
        check_database(backend, "--pg-uri" if args.pg_uri else "the team store's PostgreSQL")
        if args.source:
            copied = copy_store(args.source.resolve(), backend, folder / "artifacts")
            print(f"[wellfed] moved {args.source} in: {copied.get('runs', 0)} run(s), "
                  f"{copied.get('metrics', 0)} metric value(s), "
                  f"{copied.get('model_versions', 0)} model version(s)", flush=True)
        server = start_server(backend, folder / "artifacts", args.host, args.port, args.workers,
                              folder / "server.log")
    except (StoreError, ValueError) as err:
        if postgres is not None:
            postgres.stop()
        print(f"error: {err}", file=sys.stderr)
        return 1
    name = socket.getfqdn() if args.host in ("0.0.0.0", "::") else args.host
    print(f"[wellfed] team store: MLflow server on {shown(backend)}, artifacts in "
          f"{folder / 'artifacts'}; log {folder / 'server.log'}\n"
          f"[wellfed] on every node and clone: export MLFLOW_TRACKING_URI=http://{name}:"
          f"{args.port} (or mlflow.tracking_uri in params.yaml); Ctrl-C stops it", flush=True)
    stopping = []

    def on_signal(signum, frame):
        stopping.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        while not stopping and server.poll() is None:
            time.sleep(0.5)
    finally:
        stop_server(server)
        if postgres is not None:
            postgres.stop()
    if not stopping:
        print(f"error: mlflow server exited ({server.returncode}); see {folder / 'server.log'}",
              file=sys.stderr)
        return 1
    print("[wellfed] team store stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
