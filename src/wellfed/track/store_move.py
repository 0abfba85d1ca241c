"""A project store moved into a team store stays moved: `make team-store ... --import
mlflow.db` renames the copied database to `mlflow.db.moved` (kept, nothing lost) and leaves
`mlflow.db.moved-to` naming the team store, so a shell without MLFLOW_TRACKING_URI is told
where the runs went instead of starting a second, empty registry beside the team's (two
registries would then disagree on what "version 7" is). Every command that opens the project's
store (the stages, `wellfed-search`, `wellfed-predict models:/...`, `wellfed-compare`, `make ui`)
resolves it through `checked` or `project_store`, so none of them makes that empty one.
"""

from __future__ import annotations

from pathlib import Path


def marker(db: Path) -> Path:
    return db.with_name(db.name + ".moved-to")


def mark_moved(db: Path, uri: str) -> Path:
    """Set the moved database `db` aside (with its -wal/-shm files) and say where it went;
    returns where it is kept."""
    kept = db.with_name(db.name + ".moved")
    for suffix in ("", "-wal", "-shm"):
        part = db.with_name(db.name + suffix)
        if part.exists():
            part.rename(kept.with_name(kept.name + suffix))
    marker(db).write_text(uri + "\n", encoding="utf-8")
    return kept


def check_moved(db: Path) -> None:
    """One line when the project's default store `db` was moved into a team store."""
    mark = marker(db)
    if mark.is_file() and not db.exists():
        uri = mark.read_text(encoding="utf-8").strip()
        raise ValueError(
            f"{db.name} was moved into the team store at {uri} (kept as {db.name}.moved): "
            f"export MLFLOW_TRACKING_URI={uri} and its login (docs/team.md), or set "
            f"mlflow.tracking_uri in params.yaml; to start a new local store instead, remove "
            f"{mark}")


def project_store(root: str | Path) -> str:
    """The project's default store, sqlite:///<root>/mlflow.db (absolute: Ray workers run
    elsewhere); one line instead when it was moved (opening it would make a new, empty one)."""
    db = Path(root).resolve() / "mlflow.db"
    check_moved(db)
    return f"sqlite:///{db}"


def checked(uri: str) -> str:
    """`uri` as it is, unless it names a sqlite store that was moved: one line then (an
    explicit sqlite:///<project>/mlflow.db, as `make ui` and docs/model.md give it)."""
    if uri.startswith("sqlite:///"):
        check_moved(Path(uri.removeprefix("sqlite:///")))
    return uri
