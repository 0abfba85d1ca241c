"""The tracking store a run records into, checked before any work: a tracking server that does
not answer, or a database URI with a wrong password or database, is one line naming the setting
and the fix, said before training (MLflow's own retries would spend minutes, then a traceback).
"""

from __future__ import annotations

import contextlib
import os
from urllib.parse import urlsplit, urlunsplit

from wellfed import environ

TIMEOUT_S = 10.0
"""How long one probe waits for an answer: milliseconds on a network, but a server's first
request took over 5 s here under a load of 18 on 2 cores."""
DATABASES = ("postgresql", "mysql", "mssql")
"""SQLAlchemy schemes MLflow takes as a store of its own (`postgresql+psycopg://...` too)."""


def setting(configured: str) -> str:
    """Where the tracking URI came from, as the user sets it (tracking.tracking_uri's order)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return "$MLFLOW_TRACKING_URI"
    return "mlflow.tracking_uri" if configured else "the default store"


def shown(uri: str) -> str:
    """`uri` fit to print: a password in it becomes ***."""
    parts = urlsplit(uri)
    if not parts.password:
        return uri
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def check_store(uri: str, where: str) -> None:
    """Raise ValueError (one line) when the store `uri` names cannot be reached: a tracking
    server (http, https) or a database MLflow writes to itself (postgresql, mysql, mssql). A
    store that refuses connections or cannot reach its database may be restarting (a team
    server's deploy, PostgreSQL's restart): it gets up to `wait_s()` seconds, said in one line,
    before the error; a refusal of the credentials, the database or the host name is at once.
    A local store (sqlite, a folder) is the stage preflight's (train/run/preflight.py)."""
    import time

    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme in ("http", "https"):
        probe, line = server_error, server_line
    elif scheme in DATABASES:
        probe, line = database_error, database_line
    else:
        return
    deadline = None  # from the first refusal (the first probe pays MLflow's import, ~3 s)
    while (error := probe(uri)) is not None:
        first = deadline is None
        deadline = deadline or time.time() + wait_s()
        if not transient(error) or time.time() >= deadline:
            raise ValueError(line(uri, where, error))
        if first:  # said once, at the first refusal (a clock test misses it on a loaded machine)
            print(f"[wellfed] {where} = {shown(uri)}: no answer yet ({short(error)}); waiting "
                  f"up to {wait_s():g} s ({WAIT_ENV}): a restart takes seconds", flush=True)
        time.sleep(2)


WAIT_ENV = "WELLFED_TRACKING_WAIT_S"


def wait_s() -> float:
    """How long a store that refuses connections gets to come back: $WELLFED_TRACKING_WAIT_S,
    else 120 s. A restart of the team store's server took 73 s in the e2e sweep on this loaded
    2-core machine, and a trial whose train stage starts then must wait, not fail; MLflow's own
    client waits ~4 minutes before it gives up a call (7 retries with backoff)."""
    return float(os.environ.get(WAIT_ENV) or 120)


def transient(error: str) -> bool:
    """Whether `error` is what a restarting store answers: a refused or timed-out connection, or
    a server whose database is down (a 5xx); not a host name that does not resolve, nor a
    refusal of the credentials or the database."""
    if any(w in error for w in ("not known", "nodename nor servname", "authentication",
                                "does not exist", "401", "403")):
        return False
    return any(w in error for w in ("Connection refused", "timed out", "could not connect",
                                    "500", "502", "503", "504", "INTERNAL_ERROR",
                                    "TEMPORARILY_UNAVAILABLE", "server closed the connection"))


def short(error: str) -> str:
    """A refusal in a few words: `connection refused`, `no answer in 10 s`, ..."""
    if "not known" in error or "nodename nor servname" in error:
        return "no such host"
    if "refused" in error or "could not connect" in error:
        return "connection refused"
    if "timed out" in error or "timeout" in error:
        return f"no answer in {TIMEOUT_S:g} s"
    lines = error.strip().splitlines()
    return lines[0][:200] if lines else "no answer"


def server_error(uri: str) -> str | None:
    """One request that reaches the server's database too (a search of one experiment), no
    retry, a short timeout: None when it answers, else MLflow's error text."""
    import mlflow

    with environ.scoped({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                         "MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(TIMEOUT_S))}):
        try:
            mlflow.MlflowClient(uri).search_experiments(max_results=1)
            return None
        except Exception as err:  # MlflowException, requests' errors: the text says which
            return str(err) or type(err).__name__


def server_line(uri: str, where: str, error: str) -> str:
    fix_uri = ("unset MLFLOW_TRACKING_URI or point it at the server" if where.startswith("$")
               else f"fix {where} in params.yaml, or set it to \"\" for the project's sqlite store")
    head = f"{where} = {shown(uri)}:"
    if any(w in error for w in ("refused", "timed out", "not known", "nodename nor servname",
                                "Failed to establish")):
        return (f"{head} the tracking server does not answer ({short(error)}); start it (`make "
                f"team-store`, docs/team.md) or {fix_uri}")
    if "401" in error or "403" in error or "Unauthorized" in error or "Permission" in error:
        return f"{head} {login_line(error)}"
    detail = error.strip().splitlines()[0][:300] if error.strip() else "no detail"
    return (f"{head} the tracking server answers but cannot serve runs ({detail}); check its "
            "database (is PostgreSQL up? the server's --backend-store-uri) and its log, then "
            "rerun")


def login() -> tuple[str | None, str, bool]:
    """Who MLflow's client logs in as: (user name, where it comes from, whether a password is
    set). Its environment variables win over its credentials file (~/.mlflow/credentials), field
    by field, as in MLflow's own client."""
    from mlflow.utils.credentials import read_mlflow_creds

    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return "(a token)", "MLFLOW_TRACKING_TOKEN", True
    found = read_mlflow_creds()
    source = ("MLFLOW_TRACKING_USERNAME" if os.environ.get("MLFLOW_TRACKING_USERNAME")
              else "~/.mlflow/credentials")
    return found.username, source, bool(found.password)


def login_line(error: str, action: str = "read its runs") -> str:
    """Why the server refused, in words: no login (401), a wrong one (401), or a login that may
    not do `action` (403); and the fix."""
    user, source, has_password = login()
    access = "docs/team.md#access"
    if "401" in error or "Unauthorized" in error or "not authenticated" in error:
        if user is None or not has_password:
            unset = "none is set" if user is None else f"'{user}' ({source}) has no password"
            return (f"the tracking server asks for a login and {unset}; export "
                    "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or put them in "
                    f"~/.mlflow/credentials (the store's admin makes accounts: {access})")
        return (f"the tracking server refused the login of '{user}' ({source}): wrong user "
                f"name or password; fix it, or ask the store's admin for an account ({access})")
    who = f"'{user}' ({source})" if user else "this client (no login set)"
    return (f"the tracking server answered 403: {who} may not {action}; ask the store's "
            f"admin for access ({access})")


def write_refusal(uri: str, experiment: str, error: str) -> str | None:
    """The line for a tracking server that refused to open a run (401, 403: a team store's
    reader, docs/team.md#access), said before any training; None for any other error."""
    if not any(code in error for code in ("error code 401", "error code 403")):
        return None
    return f"{shown(uri)}: " + login_line(error, f"open a run in the experiment '{experiment}' "
                                                 "(writes take the role 'team')")


def check_database(uri: str, where: str) -> None:
    """Connect once to a database store; a refusal becomes one line, never echoing the
    password (scripts/team_store.py checks its own URI with it)."""
    if (error := database_error(uri)) is not None:
        raise ValueError(database_line(uri, where, error))


def database_error(uri: str) -> str | None:
    """Connect once (5 s timeout): None when it works, else the driver's error text."""
    try:
        import sqlalchemy
    except ImportError:  # mlflow brings it; a store of its own needs it
        raise ValueError(f"SQLAlchemy is not installed (pip install sqlalchemy), which a "
                         f"database store needs: {shown(uri)}") from None
    args = {"connect_timeout": int(TIMEOUT_S)} if uri.startswith("postgresql") else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=args)
    except ImportError as err:  # no driver: postgresql:// is psycopg 3 from SQLAlchemy 2.1 on
        raise ValueError(f"{shown(uri)}: its database driver is not installed ({err}); pip "
                         "install 'psycopg[binary]' and write the URI postgresql+psycopg://... "
                         "(the driver wellfed installs)") from None
    try:
        with engine.connect():
            return None
    except Exception as err:
        return str(getattr(err, "orig", None) or err) or type(err).__name__
    finally:
        with contextlib.suppress(Exception):
            engine.dispose()


def database_line(uri: str, where: str, error: str) -> str:
    parts = urlsplit(uri)
    head = f"{where} = {shown(uri)}:"
    database = parts.path.lstrip("/")
    if "password authentication failed" in error or "no password supplied" in error:
        why = (f"the database refused user '{parts.username}' (wrong password); fix the password "
               "in the URI (postgresql://USER:PASSWORD@HOST:PORT/DB)")
    elif "does not exist" in error and "database" in error:
        why = (f"no database '{database}' on that server; create it (`createdb {database}`) or "
               "name an existing one in the URI")
    elif "role" in error and "does not exist" in error:
        why = f"no user '{parts.username}' on that server; create it or fix the URI's user"
    elif "refused" in error or "could not connect" in error or "timeout" in error.lower():
        why = (f"nothing answers at {parts.hostname}:{parts.port or 5432}; start the database "
               "(or `make team-store`, docs/team.md) or fix the host and port")
    else:
        lines = error.strip().splitlines()
        why = f"the database refused the connection ({lines[0][:300] if lines else 'no detail'})"
    return f"{head} {why}"
