"""The project's files as committed, not as the workspace holds them: `dvc exp run -S` (the
README's tour, a search's winner) rewrites the workspace's params.yaml, and a test about the
project's own defaults must not fail in every clone where a user ran one experiment."""

from __future__ import annotations

import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]


def committed_text(name: str, root: Path = PROJECT) -> str:
    """`git show HEAD:<name>` in `root`; the file itself where `root` is not a git checkout
    (an unpacked sdist) or has no commit yet."""
    try:
        done = subprocess.run(["git", "show", f"HEAD:{name}"], cwd=root, capture_output=True,
                              text=True, timeout=60)
    except OSError:  # no git on this machine
        done = None
    if done is not None and done.returncode == 0:
        return done.stdout
    return (root / name).read_text(encoding="utf-8")


def committed_params(tmp_path: Path, root: Path = PROJECT) -> Path:
    """The committed params.yaml, written to `tmp_path/params.yaml` (for loaders that take a
    path)."""
    path = tmp_path / "params.yaml"
    path.write_text(committed_text("params.yaml", root), encoding="utf-8")
    return path
