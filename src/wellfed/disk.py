"""Bytes on disk: files shared by hard links, and what a finished training run leaves behind,
a file hard-linked into several places counted once (its first place)."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path


def usage(places: dict[str, Path | None]) -> dict[str, int]:
    """Bytes under each place, in order; a file already counted under an earlier place (the
    same inode: a hard link) adds nothing. A missing place (None, or gone) counts 0."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for label, root in places.items():
        total = 0
        for path in files(root):
            st = path.lstat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
        out[label] = total
    return out


def files(root: Path | None) -> list[Path]:
    if root is None or not os.path.lexists(root):
        return []
    if root.is_file():
        return [root]
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def mb(count: int) -> str:
    return f"{count / 1e6:,.1f} MB"


def left_behind(model_dir: Path, mlflow_model: Path | None, run_dir: Path | None) -> str:
    """`this run leaves 176.3 MB: data/model 88.1 MB, ...`: the stage's line. Shared storage
    and a remote MLflow store are not counted (and say so)."""
    places = {str(model_dir): model_dir, "the MLflow model": mlflow_model,
              "its checkpoints": run_dir}
    sizes = usage(places)
    parts = [f"{label} {mb(sizes[label])}" for label, where in places.items() if where]
    missing = [label for label, where in places.items() if where is None]
    return (f"this run leaves {mb(sum(sizes.values()))} here: {', '.join(parts)} (a file "
            "hard-linked into several of them counts once)"
            + (f"; not counted, not on this machine: {', '.join(missing)}" if missing else ""))


def link_tree(source: Path, dest: Path) -> bool:
    """Hard-link every file under `source` into `dest` (built beside it, renamed when whole);
    False, with nothing left behind, where the filesystem cannot (another device, no links)."""
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        for path in sorted(source.rglob("*")):
            if path.is_file():
                target = tmp / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.hardlink_to(path)
        tmp.rename(dest)
        return True
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()
