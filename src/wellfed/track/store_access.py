"""Who may do what on the team store (scripts/team_store.py, docs/team.md#access): MLflow's own
authentication (`mlflow server --app-name basic-auth`), set up and locked down.

- **Everyone reads, with an account.** `default_permission = READ`: any user the server knows
  reads every experiment and model; a request without a login is refused (401).
- **The team writes.** The role `team` holds EDIT on every experiment and registered model: it
  logs runs and registers versions.
- **`@champion` moves only for the role `champion`** (and admins). MLflow's permissions cannot
  say this: setting any alias takes EDIT on the model, the same as registering a version
  (deleting one takes MANAGE). So the server's authorization function (`authenticate` below,
  MLflow's basic-auth check plus this one rule) refuses, with a 403, a set or delete of a
  protected alias (WELLFED_PROTECTED_ALIASES, default `champion`) by anyone else.
- **Secrets.** The admin's password and the Flask secret key live in 0600 files in the store's
  `auth/` folder and reach the server through its environment, never its command line; the
  users' database is a sqlite file beside them.
"""

from __future__ import annotations

import configparser
import os
import re
import secrets
from pathlib import Path

from wellfed import environ
from wellfed.track.store_postgres import secret_file

ADMIN = "admin"
TEAM, CHAMPION = "team", "champion"
WORKSPACE = "default"  # MLflow's one workspace while workspaces are off (its default)
ALIASES_ENV = "WELLFED_PROTECTED_ALIASES"
ROLES = {TEAM: [("experiment", "EDIT"), ("registered_model", "EDIT")],
         CHAMPION: [("experiment", "EDIT"), ("registered_model", "MANAGE")]}
"""Each role's grants, on every resource of the type ("*")."""
ROLE_NOTES = {TEAM: "wellfed: logs runs and registers model versions",
              CHAMPION: "wellfed: also moves the protected aliases (@champion)"}
AUTH_CACHE_S = 60
"""How long a server worker trusts a login it checked (MLflow's auth_cache_ttl_seconds)."""
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
"""A user name --add-user takes: it names the user's credentials file too."""


def prepare(folder: Path, protected: str = CHAMPION) -> dict:
    """Make the `auth` folder of the store in `folder` once (config, users' database, admin
    password, Flask secret key); return the server's environment for it."""
    auth = folder / "auth"
    auth.mkdir(parents=True, exist_ok=True)
    auth.chmod(0o700)
    for name in ("admin.password", "secret_key"):
        if not (auth / name).is_file():
            secret_file(auth / name, secrets.token_urlsafe(24) + "\n")
    config = configparser.ConfigParser()
    config["mlflow"] = {"default_permission": "READ",
                        "database_uri": f"sqlite:///{auth / 'users.db'}",
                        "admin_username": ADMIN,
                        "authorization_function": f"{__name__}:authenticate",
                        # a login checked once a minute per server worker, not on every request:
                        # each check is a scrypt hash (0.27 s of CPU here), and a run's logging
                        # is hundreds of requests (docs/team.md#access: what it delays)
                        "auth_cache_ttl_seconds": str(AUTH_CACHE_S)}
    with open(auth / "basic_auth.ini", "w") as out:
        config.write(out)
    return {"MLFLOW_AUTH_CONFIG_PATH": str(auth / "basic_auth.ini"),
            "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password(folder),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": (auth / "secret_key").read_text().strip(),
            ALIASES_ENV: protected}


def admin_password(folder: Path) -> str:
    return (folder / "auth" / "admin.password").read_text().strip()


def as_admin(folder: Path) -> dict:
    """The client environment of the store's admin (its password from the 0600 file)."""
    return {"MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": admin_password(folder)}


def client(uri: str):
    """MLflow's auth client. It reads the login from the environment at each request: its
    callers set the admin's for their calls (`as_admin`) and restore it after."""
    from mlflow.server import get_app_client

    return get_app_client("basic-auth", tracking_uri=uri)


def set_up_roles(uri: str, folder: Path) -> dict[str, int]:
    """The roles `team` and `champion` with their grants (ROLES), made when missing; return
    their ids."""
    with environ.scoped(as_admin(folder)):
        auth = client(uri)
        have = {role.name: role for role in auth.list_roles(WORKSPACE)}
        ids = {}
        for name, grants in ROLES.items():
            role = have.get(name) or auth.create_role(WORKSPACE, name, ROLE_NOTES[name])
            ids[name] = role.id
            granted = {(p.resource_type, p.resource_pattern, p.permission)
                       for p in auth.list_role_permissions(role.id)}
            for resource, permission in grants:
                if (resource, "*", permission) not in granted:
                    auth.add_role_permission(role.id, resource, "*", permission)
    return ids


def add_user(uri: str, folder: Path, name: str, roles: list[str]) -> Path:
    """A user with a random password and `roles`; its login in a 0600 credentials file
    (MLflow's ~/.mlflow/credentials format) under the store's auth folder, returned."""
    if not USER_NAME.fullmatch(name):
        raise ValueError(f"--add-user {name!r}: a user name is 1 to 64 letters, digits and . _ @ "
                         "-, starting with a letter or digit; choose one such")
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ValueError(f"--role {unknown[0]}: no such role; choose from {', '.join(ROLES)}")
    password = secrets.token_urlsafe(18)
    ids = set_up_roles(uri, folder)
    with environ.scoped(as_admin(folder)):
        auth = client(uri)
        auth.create_user(name, password)
        for role in roles:
            auth.assign_role(name, ids[role])
    users = folder / "auth" / "users"
    users.mkdir(mode=0o700, exist_ok=True)
    return secret_file(users / f"{name}.credentials",
                       f"[mlflow]\nmlflow_tracking_username = {name}\n"
                       f"mlflow_tracking_password = {password}\n")


def moved_alias(request) -> str | None:
    """The alias a request sets or deletes (MLflow's REST route .../registered-models/alias),
    else None."""
    if not request.path.rstrip("/").endswith("/registered-models/alias"):
        return None
    if request.method not in ("POST", "DELETE", "PATCH", "PUT"):
        return None
    body = request.get_json(silent=True) or {}
    return str(body.get("alias") or request.args.get("alias") or "")


CREATES = ("/experiments/create", "/registered-models/create")
"""What MLflow lets any user do (the creator then MANAGEs it): kept to the team here."""


def creates(request) -> str | None:
    """`experiment` or `registered model` when the request makes one, else None."""
    path = request.path.rstrip("/")
    if request.method == "POST" and path.endswith(CREATES):
        return "experiment" if path.endswith(CREATES[0]) else "registered model"
    return None


def roles_of(username: str) -> set[str] | None:
    """The names of `username`'s roles; None for an admin (who may do anything)."""
    from mlflow.server.auth import store

    user = store.get_user(username)
    return None if user.is_admin else {role.name for role in store.list_user_roles(user.id)}


def authenticate():
    """The server's authorization function (basic_auth.ini): MLflow's basic-auth check, then
    two rules of ours, a 403 otherwise: a protected alias moves only for the role `champion`,
    and only the roles `team` and `champion` make experiments and registered models (MLflow
    lets any user; the maker then MANAGEs it). Admins pass both."""
    from flask import make_response, request
    from mlflow.server.auth import authenticate_request_basic_auth

    who = authenticate_request_basic_auth()
    if not getattr(who, "username", None):
        return who  # MLflow's 401
    protected = {a.strip() for a in os.environ.get(ALIASES_ENV, CHAMPION).split(",") if a.strip()}
    alias, made = moved_alias(request), creates(request)
    refusal = None
    if alias in protected and (roles := roles_of(who.username)) is not None \
            and CHAMPION not in roles:
        refusal = f"@{alias} moves only for the role '{CHAMPION}', which user " \
                  f"'{who.username}' does not hold"
    elif made and (roles := roles_of(who.username)) is not None and not roles & set(ROLES):
        refusal = f"a new {made} is made only by the roles '{TEAM}' and '{CHAMPION}', " \
                  f"neither of which user '{who.username}' holds"
    if refusal is None:
        return who
    response = make_response(f"Permission denied: {refusal}; ask the store's admin "
                             "(docs/team.md#access)")
    response.status_code = 403
    return response
