"""A project store moved into a team store stays moved: `make team-store ... --import
mlflow.db` renames the copied database to `mlflow.db.moved` (kept, nothing lost) and leaves
`mlflow.db.moved-to` naming the team store, so a shell without MLFLOW_TRACKING_URI is told
where the runs went instead of starting a second, empty registry beside the team's (two
registries would then disagree on what "version 7" is).
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
