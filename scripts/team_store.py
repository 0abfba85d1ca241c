"""The team store: an MLflow tracking server on PostgreSQL that proxies its artifacts, so that
every node of a Ray cluster and every clone of the project records into one place without a
shared filesystem (docs/team.md).

    python scripts/team_store.py [--dir .team-store] [--host 127.0.0.1] [--port 5000]
                                 [--pg-uri postgresql+psycopg://USER@HOST:PORT/DB]
    python scripts/team_store.py --dir .team-store --add-user NAME [--role team|champion]
    make team-store                          # the same, with the defaults

Without --pg-uri it keeps a PostgreSQL of its own under --dir (track/store_postgres.py: its own
superuser, a role `mlflow` that is not one, passwords on every connection, none on a command
line), on a loopback port recorded in <dir>/postgres/port. With --pg-uri it uses that
database, whose password comes from a pgpass file (PGPASSFILE, ~/.pgpass) or PGPASSWORD, never
from the URI. The server stores artifacts under <dir>/artifacts and serves them
(`--serve-artifacts`). It asks every client for a login (MLflow's basic-auth,
track/store_access.py): the admin's password is in <dir>/auth/admin.password (0600);
--add-user makes more. `--no-auth-i-know` serves without logins, to anyone who reaches the
port. It runs in the foreground and prints the tracking URI to set; Ctrl-C or SIGTERM stops the
server and the PostgreSQL it started. A store folder has one owner: starting or importing into
one whose PostgreSQL or server runs is refused in one line naming it, and nothing is stopped.

The functions here are what the e2e tests start and stop (tests/e2e/teamstore.py).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:  # run from a clone without `pip install -e .`
    sys.path.insert(0, str(SRC))

from wellfed.track import store_access, store_move  # noqa: E402
from wellfed.track.store_copy import copy_store  # noqa: E402
from wellfed.track.store_postgres import (  # noqa: E402,F401  (the e2e tests' names)
    Postgres, StoreError, alive, free_port, pg_user, postgres_binaries)
from wellfed.track.stores import check_database, shown  # noqa: E402

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def claim(folder: Path, postgres: Postgres | None):
    """This process's hold on the store in `folder`, kept until it exits (an flock on
    <dir>/owner.lock, which no child inherits). Refused, in one line naming the running one, when
    another team store holds it, or its PostgreSQL or server still runs without one (a store
    whose owner was killed): nothing is started or stopped then."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = open(folder / "owner.lock", "a+")
    busy = f"{folder} is in use:"
    fix = "stop it first (Ctrl-C where it runs) or choose another --dir; nothing was started"
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        owner = (folder / "owner").read_text().strip() if (folder / "owner").is_file() else "?"
        raise StoreError(f"{busy} its team store runs ({owner}); {fix} or stopped") from None
    try:
        if postgres is not None and (running := postgres.running()):
            raise StoreError(f"{busy} its PostgreSQL runs (pid {running[0]}, port {running[1]}) "
                             f"with no team store holding it; stop it (pg_ctl -D "
                             f"{postgres.data} stop) or choose another --dir; nothing was "
                             "started or stopped")
        if (server := running_server(folder)) is not None:
            raise StoreError(f"{busy} its MLflow server runs ({server}) with no team store "
                             f"holding it; stop it (kill {server.split()[0].split('=')[1]}) or "
                             "choose another --dir; nothing was started or stopped")
    except StoreError:
        lock.close()
        raise
    return lock


def running_server(folder: Path) -> str | None:
    """`pid=N port=P` of the server a team store of `folder` started, if it still runs."""
    with contextlib.suppress(OSError, ValueError):
        text = (folder / "server.pid").read_text().strip()
        if alive(int(text.split()[0].split("=")[1])):
            return text
    return None


def allowed_hosts(host: str, extra: list[str] = ()) -> list[str]:
    """The Host headers the server answers. MLflow's default is loopback and private IPs, so a
    client that names this machine (http://mlflow-host:5000) would be refused: when it listens
    beyond loopback, this machine's names are added, and `extra` names always (a TLS proxy's,
    which passes the client's Host on: `mlflow.example.com`, with or without a port)."""
    from mlflow.server.security_utils import get_default_allowed_hosts

    names = {socket.gethostname(), socket.getfqdn()} if host not in LOOPBACK else set()
    named = [f"{name}:*" for name in sorted(names)]
    for name in extra:
        named += [name, f"{name}:*"]
    return get_default_allowed_hosts() + named


JOBS = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
"""MLflow's server runs its jobs (GenAI scorers, prompt optimisation: nothing wellfed logs) in 8
more processes by default. Off, a 2-worker server answered /health in 7.6 s instead of 13.1 and
held 5 processes instead of 13, 10.9 CPU-s instead of 43.8 and 0.8 GB instead of 2.7 after 30 s
idle (benchmarks/results/server_jobs.json). A user who wants them sets it true."""


def start_server(backend: str, artifacts: Path, host: str, port: int, workers: int = 4,
                 log: Path | None = None, timeout: float = 120, env: dict | None = None,
                 auth: bool = True, hosts: list[str] = ()) -> subprocess.Popen:
    """`mlflow server` on `backend` (no password in it: `env` carries PGPASSFILE), proxying
    artifacts stored in `artifacts`, with MLflow's basic-auth when `auth` (`env` carries its
    config, store_access.prepare), in a session of its own (so its workers stop with it);
    returns once it answers /health."""
    if urlsplit(backend).password:
        raise StoreError(f"{shown(backend)}: a password in the backend URI would be on the "
                         "server's command line; give it in a pgpass file (PGPASSFILE)")
    artifacts.mkdir(parents=True, exist_ok=True)
    out = open(log, "a") if log else subprocess.DEVNULL
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend,
         "--artifacts-destination", str(artifacts.resolve()), "--serve-artifacts",
         "--host", host, "--port", str(port), "--workers", str(workers),
         "--allowed-hosts", ",".join(allowed_hosts(host, hosts)),
         *(["--app-name", "basic-auth"] if auth else [])],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        env={JOBS: "false", **os.environ, **(env or {}),  # a user's or caller's JOBS wins
             "PYTHONPATH": path,  # the auth function's module
             "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"})
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


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=".team-store", type=Path,
                        help="its PostgreSQL (without --pg-uri), users, artifacts and logs")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the server's interface: 0.0.0.0 for other machines (default "
                             "127.0.0.1, this one only)")
    parser.add_argument("--port", default=5000, type=int)
    parser.add_argument("--allowed-host", dest="hosts", action="append",
                        default=[h for h in os.environ.get("TEAM_STORE_ALLOWED_HOSTS",
                                                           "").split(",") if h.strip()],
                        help="a host name clients reach the server by, beyond loopback, private "
                             "IPs and this machine's names: a TLS proxy's (mlflow.example.com); "
                             "repeat it, or TEAM_STORE_ALLOWED_HOSTS=a,b")
    parser.add_argument("--workers", default=4, type=int, help="server worker processes")
    parser.add_argument("--pg-uri", default="",
                        help="an existing PostgreSQL database (postgresql+psycopg://USER@HOST:"
                             "PORT/DB; its password in a pgpass file or PGPASSFILE, never here) "
                             "instead of one of its own")
    parser.add_argument("--import", dest="source", type=Path,
                        help="move a project's store (its mlflow.db, with the mlruns/ beside "
                             "it) into this one, fresh, before the server starts (docs/team.md)")
    parser.add_argument("--no-auth-i-know", dest="no_auth", action="store_true",
                        default=os.environ.get("TEAM_STORE_NO_AUTH") == "1",
                        help="serve without logins: anyone who reaches the port writes runs and "
                             "moves @champion (TEAM_STORE_NO_AUTH=1)")
    parser.add_argument("--protected-alias", default=store_access.CHAMPION,
                        help="aliases (comma-separated) only the role 'champion' moves")
    parser.add_argument("--add-user", metavar="NAME",
                        help="add a user to the running store on --port, with a random password "
                             "in <dir>/auth/users/NAME.credentials (0600), and exit")
    parser.add_argument("--role", action="append", default=[],
                        choices=sorted(store_access.ROLES),
                        help="with --add-user: team (writes runs, registers versions) or "
                             "champion (also moves @champion); none: reads only")
    return parser.parse_args(argv)


def add_user(args: argparse.Namespace, folder: Path) -> int:
    uri = f"http://127.0.0.1:{args.port}"
    try:
        made = store_access.add_user(uri, folder, args.add_user, args.role)
    except ValueError as err:  # the name
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # MlflowException, a refused connection: the text says which
        why = str(err).splitlines()[0][:300]
        if "RESOURCE_ALREADY_EXISTS" in why:
            why = ("that user exists; choose another name, or change its password as the admin "
                   "(MLflow's update_user_password, docs/team.md#access)")
        print(f"error: --add-user {args.add_user} on {uri}: {why}", file=sys.stderr)
        return 1
    print(f"[wellfed] user {args.add_user} ({', '.join(args.role) or 'reads only'}): login in "
          f"{made} (0600); give it to them as ~/.mlflow/credentials, or export "
          "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    folder = args.dir.resolve()
    if args.add_user:
        return add_user(args, folder)
    postgres = started = server = None
    try:
        if args.pg_uri and urlsplit(args.pg_uri).password:
            raise StoreError(f"--pg-uri {shown(args.pg_uri)}: a password in the URI is on "
                             "the command line, which `ps` shows every user; drop it and put it "
                             "in a pgpass file (HOST:PORT:DB:USER:PASSWORD, mode 0600; "
                             "PGPASSFILE names it, default ~/.pgpass) or PGPASSWORD")
        if not args.pg_uri:
            postgres = Postgres(folder / "postgres", user=pg_user())
        lock = claim(folder, postgres)  # noqa: F841  (held until this process exits)
        env = {}
        if postgres is not None:
            postgres.init()
            postgres.start()
            started = postgres
            backend = postgres.uri
            env["PGPASSFILE"] = os.environ["PGPASSFILE"] = str(postgres.pgpass)
        else:
            backend = args.pg_uri
        check_database(backend, "--pg-uri" if args.pg_uri else "the team store's PostgreSQL")
        if args.source:
            copied = copy_store(args.source.resolve(), backend, folder / "artifacts")
            print(f"[wellfed] moved {args.source} in: {copied.get('runs', 0)} run(s), "
                  f"{copied.get('metrics', 0)} metric value(s), "
                  f"{copied.get('model_versions', 0)} model version(s)", flush=True)
            host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
            kept = store_move.mark_moved(args.source.resolve(), f"http://{host}:{args.port}")
            print(f"[wellfed] {args.source} set aside as {kept.name}: a shell without "
                  f"MLFLOW_TRACKING_URI is told where the runs went", flush=True)
        if not args.no_auth:
            env.update(store_access.prepare(folder, args.protected_alias))
        server = start_server(backend, folder / "artifacts", args.host, args.port, args.workers,
                              folder / "server.log", env=env, auth=not args.no_auth,
                              hosts=[h.strip() for h in args.hosts])
        (folder / "server.pid").write_text(f"pid={server.pid} port={args.port}\n")
        (folder / "owner").write_text(f"pid {os.getpid()}, server on {args.host}:{args.port}\n")
        if not args.no_auth:
            try:
                store_access.set_up_roles(f"http://127.0.0.1:{args.port}", folder)
            except Exception as err:  # MlflowException: the server's own words
                raise StoreError(f"setting up the roles on the server failed: "
                                 f"{str(err).splitlines()[0][:300]}; see "
                                 f"{folder / 'server.log'}") from None
    except (StoreError, ValueError) as err:
        if server is not None:
            stop_server(server)
            for name in ("server.pid", "owner"):
                (folder / name).unlink(missing_ok=True)
        if started is not None:
            started.stop()
        print(f"error: {err}", file=sys.stderr)
        return 1
    name = socket.getfqdn() if args.host in ("0.0.0.0", "::") else args.host
    print(f"[wellfed] team store: MLflow server on {shown(backend)}, artifacts in "
          f"{folder / 'artifacts'}; log {folder / 'server.log'}", flush=True)
    if args.no_auth:
        print(f"[wellfed] no logins (--no-auth-i-know): anyone who reaches {args.host}:"
              f"{args.port} writes runs and moves @champion", flush=True)
    else:
        print(f"[wellfed] logins: admin's password in {folder / 'auth' / 'admin.password'} "
              f"(0600); add one per person: python scripts/team_store.py --dir {args.dir} "
              f"--port {args.port} --add-user NAME --role team (docs/team.md#access)", flush=True)
    print(f"[wellfed] on every node and clone: export MLFLOW_TRACKING_URI=http://{name}:"
          f"{args.port} (or mlflow.tracking_uri in params.yaml); Ctrl-C stops it", flush=True)
    return serve(server, postgres, folder)


def serve(server: subprocess.Popen, postgres: Postgres | None, folder: Path) -> int:
    """Wait for Ctrl-C, SIGTERM or the server's end; then stop the server and PostgreSQL."""
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
        for name in ("server.pid", "owner"):
            (folder / name).unlink(missing_ok=True)
    if not stopping:
        print(f"error: mlflow server exited ({server.returncode}); see {folder / 'server.log'}",
              file=sys.stderr)
        return 1
    print("[wellfed] team store stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
