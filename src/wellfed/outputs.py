"""Atomic stage outputs: build in a temporary sibling, rename into place only when complete.

A stage that fails or is killed half-way therefore never leaves a file or directory that DVC or
the next stage could mistake for a finished output, and an older complete output stays intact
until the new one is ready.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(final: str | Path, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `final`; on success replace `final` with it."""
    final = Path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(f"{final.parent}: cannot create output directory ({err.strerror}); "
                      "check the path and its permissions") from None
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    if is_dir:
        tmp.mkdir()
    try:
        yield tmp
        if final.is_dir() and not final.is_symlink():
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | Path, data) -> None:
    """Write `data` as pretty JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
