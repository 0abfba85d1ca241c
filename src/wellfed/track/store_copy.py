"""Move a project's MLflow store (sqlite:///<project>/mlflow.db and its mlruns/ artifacts) into
the team store (a fresh PostgreSQL database behind an MLflow server that proxies artifacts),
whole: the same experiment, run, logged-model and version ids, every metric value, the
registry's aliases and tags, the artifacts.

MLflow has no command for it. Both stores are MLflow's own SQL schema, so the copy is table by
table, after bringing a copy of the old file to the installed MLflow's schema (`mlflow db
upgrade` on the copy: the original is not touched). Artifact locations change on the way: an
experiment's folder on this disk (`/project/mlruns/1`) becomes the server's
`mlflow-artifacts:/1`, its files copied into the server's artifact folder, and every stored
location under it (runs, logged models, model versions) follows.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHUNK = 5000
"""Rows per INSERT: a store of many runs has millions of metric rows."""


def local_folder(location: str) -> Path | None:
    """An artifact location on this machine (a path or file:// URI) as a folder, else None."""
    parts = urlsplit(location)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if parts.scheme == "" and location.startswith("/"):
        return Path(location)
    return None


def upgraded_copy(db: Path, folder: Path) -> str:
    """A copy of the sqlite file, at the installed MLflow's schema; its URI."""
    copy = folder / "mlflow.db"
    shutil.copy2(db, copy)
    uri = f"sqlite:///{copy}"
    proc = subprocess.run([sys.executable, "-m", "mlflow", "db", "upgrade", uri],
                          capture_output=True, text=True)
    if proc.returncode:
        lines = proc.stderr.strip().splitlines()
        raise ValueError(f"{db} cannot be brought to this MLflow's schema: "
                         f"{lines[-1] if lines else proc.returncode}")
    return uri


def copy_store(db: Path, target: str, artifacts: Path) -> dict[str, int]:
    """Copy the sqlite store `db` into the SQL store `target` (fresh: no run, no registered
    model), artifacts into `artifacts` (the server's --artifacts-destination); return the rows
    copied per table. Raises ValueError (one line) when it cannot."""
    import sqlalchemy as sa
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with tempfile.TemporaryDirectory() as tmp:
        source_uri = upgraded_copy(db, Path(tmp))
        SqlAlchemyStore(target, "mlflow-artifacts:/")  # the target's tables, at the same schema
        source, dest = sa.create_engine(source_uri), sa.create_engine(target)
        try:
            return _copy(source, dest, artifacts, db)
        finally:
            source.dispose()
            dest.dispose()


def _copy(source, dest, artifacts: Path, db: Path) -> dict[str, int]:
    import sqlalchemy as sa

    old, new = sa.MetaData(), sa.MetaData()
    old.reflect(source)
    new.reflect(dest)
    with source.connect() as src, dest.begin() as out:
        versions = [src.execute(sa.text("SELECT version_num FROM alembic_version")).scalar(),
                    out.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()]
        if versions[0] != versions[1]:
            raise ValueError(f"the schemas differ after the upgrade ({versions[0]} vs "
                             f"{versions[1]}): run the same MLflow version as the server")
        for table in ("runs", "registered_models"):
            if out.execute(sa.select(sa.func.count()).select_from(new.tables[table])).scalar():
                raise ValueError(f"the team store already holds {table.replace('_', ' ')}: "
                                 "import into a fresh one (a new --dir, or an empty database)")
        moves = artifact_moves(src, old, artifacts)
        tables = [t for t in new.sorted_tables if t.name != "alembic_version"]
        missing = [t.name for t in tables if t.name not in old.tables]
        for table in reversed(tables):  # the fresh store's own rows (its Default experiment)
            out.execute(table.delete())
        copied = {}
        for table in tables:
            if table.name in missing:
                continue
            columns = [c.name for c in table.columns if c.name in old.tables[table.name].c]
            rows = src.execute(sa.select(*[old.tables[table.name].c[c] for c in columns]))
            count = 0
            while batch := rows.fetchmany(CHUNK):
                out.execute(table.insert(), [
                    {c: moved(v, moves) for c, v in zip(columns, row)} for row in batch])
                count += len(batch)
            copied[table.name] = count
        if dest.dialect.name == "postgresql":
            restart_sequences(out, tables)
    for folder, (_, to) in moves.items():
        if folder.is_dir():
            shutil.copytree(folder, to, dirs_exist_ok=True)
    return copied


def artifact_moves(src, old, artifacts: Path) -> dict[Path, tuple[str, Path]]:
    """Each experiment's folder on this disk -> (its mlflow-artifacts:/ URI, its folder under
    the server's artifact root)."""
    import sqlalchemy as sa

    experiments = old.tables["experiments"]
    moves = {}
    for exp_id, location in src.execute(sa.select(experiments.c.experiment_id,
                                                  experiments.c.artifact_location)):
        folder = local_folder(location or "")
        if folder is not None:
            moves[folder] = (f"mlflow-artifacts:/{exp_id}", artifacts / str(exp_id))
    return moves


def moved(value, moves: dict[Path, tuple[str, Path]]):
    """`value` with a location under a moved experiment folder rewritten to the server's URI."""
    if not isinstance(value, str) or not moves:
        return value
    folder = local_folder(value)
    if folder is None:
        return value
    for old, (uri, _) in moves.items():
        if folder == old or old in folder.parents:
            return uri + folder.as_posix()[len(old.as_posix()):]
    return value


def restart_sequences(out, tables) -> None:
    """PostgreSQL hands out serial ids from a sequence the copied rows did not advance: move each
    past the largest id copied (experiment ids, metric row ids...)."""
    import sqlalchemy as sa

    for table in tables:
        for column in table.primary_key.columns:
            sequence = out.execute(sa.text("SELECT pg_get_serial_sequence(:t, :c)"),
                                   {"t": table.name, "c": column.name}).scalar()
            if sequence:
                out.execute(sa.text(f"SELECT setval('{sequence}', COALESCE((SELECT MAX("
                                    f"{column.name}) FROM {table.name}), 0) + 1, false)"))
