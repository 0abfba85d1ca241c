"""The team store's own PostgreSQL (scripts/team_store.py, docs/team.md#access): a cluster in a
folder of its own, locked down.

- `initdb`'s superuser (`postgres`) is separate from the role MLflow uses (`mlflow`), which is
  not a superuser and owns only its database: a leaked `mlflow` password reaches the runs, not
  the machine (a superuser can run programs as the database's OS user, `COPY ... TO PROGRAM`).
- Every connection, over TCP or the socket, logs in with a password (scram-sha-256): no `trust`.
- No password on a command line: each lives in a 0600 file, and the programs find it through a
  pgpass file (PGPASSFILE), never through argv, which every user reads with `ps`.

PostgreSQL refuses to run as root: as root, its commands run as the user `postgres` (the OS
package makes it), else `nobody`, through `runuser`, and its folder is given to that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
from pathlib import Path

from wellfed.outputs import running as alive  # whether a pid runs (the team store's name)

ROLE = DATABASE = "mlflow"
SUPERUSER = "postgres"


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
    missing = [b for b in ("initdb", "pg_ctl", "psql") if shutil.which(b) is None]
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


def secret_file(path: Path, text: str, user: str | None = None) -> Path:
    """`text` in a file only its owner (`user`, else this one) reads: made 0600 before a byte
    is written, so no other user ever sees it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)
    if user:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _run(cmd: list[str], what: str, **kwargs) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise StoreError(f"{what} failed: {lines[-1] if lines else proc.returncode}")
    return proc.stdout


class Postgres:
    """A PostgreSQL cluster in `folder` (data, socket, log, passwords, port), run as `user`."""

    def __init__(self, folder: Path, port: int | None = None, user: str | None = None):
        self.folder, self.user = folder.resolve(), user
        self.data, self.sockets = self.folder / "data", self.folder / "sockets"
        recorded = self.folder / "port"
        self.port = port or (int(recorded.read_text()) if recorded.is_file() else free_port())

    @property
    def password(self) -> str:
        """The `mlflow` role's password (a 0600 file of this user's)."""
        return (self.folder / "password").read_text().strip()

    @property
    def pgpass(self) -> Path:
        """The pgpass file the server and its clients on this machine log in with (PGPASSFILE)."""
        return self.folder / "pgpass"

    @property
    def uri(self) -> str:
        """The database URI, without its password (the pgpass file holds it).
        +psycopg: the driver pyproject installs, whatever SQLAlchemy takes plain postgresql://
        for (psycopg 3 from SQLAlchemy 2.1 on, psycopg2 before)."""
        return f"postgresql+psycopg://{ROLE}@127.0.0.1:{self.port}/{DATABASE}"

    def running(self) -> tuple[int, int] | None:
        """(pid, port) of the postmaster running on this folder's data, if one does."""
        pidfile = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            lines = pidfile.read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
            if alive(pid):
                return pid, port
        return None

    def init(self) -> None:
        """initdb (once): superuser `postgres`, scram-sha-256 on the socket and TCP alike."""
        if (self.data / "PG_VERSION").is_file():
            if not (self.folder / "superuser.password").is_file():
                raise StoreError(
                    f"{self.data} was made by an earlier wellfed: its role `mlflow` is a "
                    "superuser and its socket trusts any local user; make a fresh store "
                    "(a new --dir) and move the runs over: dump it (`pg_dump`) or start the old "
                    "one and `mlflow`-export, then remove the old folder")
            return
        postgres_binaries()
        owned_by(self.folder, self.user)
        secret = secret_file(self.folder / "superuser.password", secrets.token_hex(16) + "\n",
                             self.user)
        _run(as_user(["initdb", "-D", str(self.data), "-U", SUPERUSER, "-A", "scram-sha-256",
                      f"--pwfile={secret}", "-E", "UTF8", "--no-instructions"], self.user),
             "initdb")
        (self.folder / "port").write_text(f"{self.port}\n")

    def superuser_env(self) -> dict:
        """The environment `psql` logs in as the superuser with: its own pgpass file (any host,
        this port), readable by PostgreSQL's user only."""
        pgpass = self.folder / "superuser.pgpass"
        if not pgpass.is_file():
            password = (self.folder / "superuser.password").read_text().strip()
            secret_file(pgpass, f"*:{self.port}:*:{SUPERUSER}:{password}\n", self.user)
        return {**os.environ, "PGPASSFILE": str(pgpass)}

    def start(self) -> None:
        """Start on 127.0.0.1:port (socket in `sockets`); on the first start make the role
        `mlflow` (no superuser, a random password) and its database."""
        postgres_binaries()
        owned_by(self.sockets, self.user)
        _run(as_user(["pg_ctl", "-D", str(self.data), "-l", str(self.folder / "log"), "-w",
                      "-t", "60", "-o", self.options(), "start"], self.user), "pg_ctl start")
        self.provision()

    def provision(self) -> None:
        """Role and database, made once; the SQL (the password in it) goes on psql's stdin."""
        if not (self.folder / "password").is_file():
            secret_file(self.folder / "password", secrets.token_hex(16) + "\n")
        password = self.password
        secret_file(self.pgpass, f"127.0.0.1:{self.port}:{DATABASE}:{ROLE}:{password}\n"
                                 f"localhost:{self.port}:{DATABASE}:{ROLE}:{password}\n")
        sql = (f"SELECT 'CREATE ROLE {ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
               f"NOREPLICATION NOBYPASSRLS' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE "
               f"rolname = '{ROLE}')\\gexec\n"
               f"ALTER ROLE {ROLE} PASSWORD '{password}';\n"
               f"SELECT 'CREATE DATABASE {DATABASE} OWNER {ROLE}' WHERE NOT EXISTS (SELECT FROM "
               f"pg_database WHERE datname = '{DATABASE}')\\gexec\n"
               f"REVOKE ALL ON DATABASE {DATABASE} FROM PUBLIC;\n"
               f"REVOKE CONNECT ON DATABASE postgres FROM PUBLIC;\n")
        _run(as_user(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.sockets),
                      "-p", str(self.port), "-U", SUPERUSER, "-d", "postgres"], self.user),
             "creating the role and database", input=sql, env=self.superuser_env())

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
