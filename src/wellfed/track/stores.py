"""The tracking store a run records into, checked before any work: a tracking server that does
not answer, or a database URI with a wrong password or database, is one line naming the setting
and the fix, said before training (MLflow's own retries would spend minutes, then a traceback).
"""

from __future__ import annotations

import contextlib
import os
from urllib.parse import urlsplit, urlunsplit

TIMEOUT_S = 5.0
"""How long a check waits for an answer: a server on the same network answers in milliseconds."""
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
    local store (sqlite, a folder) is the stage preflight's (train/preflight.py)."""
    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme in ("http", "https"):
        check_server(uri, where)
    elif scheme in DATABASES:
        check_database(uri, where)


def check_server(uri: str, where: str) -> None:
    """One request that reaches the server's database too (a search of one experiment), no
    retry, a short timeout; its answer mapped to a line."""
    import mlflow

    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES",
                                             "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
                      MLFLOW_HTTP_REQUEST_TIMEOUT=str(int(TIMEOUT_S)))
    try:
        mlflow.MlflowClient(uri).search_experiments(max_results=1)
    except Exception as err:  # MlflowException, requests' errors: the text says which
        raise ValueError(server_line(uri, where, str(err))) from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def server_line(uri: str, where: str, error: str) -> str:
    fix_uri = (f"unset MLFLOW_TRACKING_URI or point it at the server" if where.startswith("$")
               else f"fix {where} in params.yaml, or set it to \"\" for the project's sqlite store")
    head = f"{where} = {shown(uri)}:"
    if any(s in error for s in ("Connection refused", "Failed to establish", "Max retries",
                                "Name or service not known", "timed out", "Read timed out")):
        why = ("no answer in 5 s" if "timed out" in error else "connection refused"
               if "refused" in error else "no such host" if "not known" in error
               else "no answer")
        return (f"{head} the tracking server does not answer ({why}); start it (`make "
                f"team-store`, docs/team.md) or {fix_uri}; nothing was trained")
    if "401" in error or "403" in error or "Unauthorized" in error or "Permission" in error:
        return (f"{head} the tracking server refused these credentials; set "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) "
                "to an account of the server's; nothing was trained")
    detail = error.strip().splitlines()[0][:300] if error.strip() else "no detail"
    return (f"{head} the tracking server answers but cannot serve runs ({detail}); check its "
            "database (is PostgreSQL up? the server's --backend-store-uri) and its log, then "
            "rerun; nothing was trained")


def check_database(uri: str, where: str) -> None:
    """Connect once (5 s timeout) to a database store; a refusal becomes one line, never
    echoing the password."""
    try:
        import sqlalchemy
    except ImportError:  # mlflow brings it; a store of its own needs it
        raise ValueError(f"{where} = {shown(uri)}: SQLAlchemy is not installed; "
                         "pip install sqlalchemy") from None
    args = {"connect_timeout": int(TIMEOUT_S)} if uri.startswith("postgresql") else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=args)
    except ImportError as err:  # no driver: postgresql:// is psycopg 3 from SQLAlchemy 2.1 on
        raise ValueError(f"{where} = {shown(uri)}: its database driver is not installed "
                         f"({err}); pip install 'psycopg[binary]' and write the URI "
                         "postgresql+psycopg://... (the driver wellfed installs)") from None
    try:
        with engine.connect():
            pass
    except Exception as err:
        original = getattr(err, "orig", None) or err
        raise ValueError(database_line(uri, where, str(original))) from None
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
    return f"{head} {why}; nothing was trained"
