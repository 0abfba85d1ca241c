"""A search's disk, checked as a stage checks its own: before any trial, every folder the search
writes into takes a file and has room for it (outputs.check_room); a write that fails later (a
full or read-only folder, whichever library wrote: wellfed's ledger, Ray Tune's syncer) stops
the search with the same line, naming the folder and what to run.

A full disk mid-search used to end in 11 `No space left on device` tracebacks from Ray's syncer
and `unexpected TuneError`.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from wellfed.disk import write_failure
from wellfed.outputs import RERUN, WriteFault, check_room

THEN = "then rerun `wellfed-search` to resume it"
TRIAL_BYTES = 2_000_000
"""Per trial, in the search folder and again in a local MLflow store: measured 60 KB in
data/search/<id> (ledger, Ray Tune's state) and 0.3 MB in a sqlite store per trial of the tiny
model; a real model's curve and reports are a few times that."""
RAY_BYTES = 100_000_000
"""Local Ray's session folder in the temp folder (its logs: 0.4 to 1.3 MB per search here),
with room for what Ray spills there."""
FULL_BYTES = 1_000_000
"""A folder with less than this free after a failed write is taken as the cause (Ray Tune
reports its syncer's ENOSPC in a TuneError without the errno)."""


def check(folder: Path, trials: int, store: Path | None, local_ray: bool) -> None:
    """Before any trial: the search folder, a local MLflow store and local Ray's temp folder
    take a file and have room for `trials` trials (the search's and the final check's)."""
    places: dict[Path, int] = {}
    for place, need in ((folder, trials * TRIAL_BYTES),
                        (store, trials * TRIAL_BYTES),
                        (Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir())
                         if local_ray else None, RAY_BYTES)):
        if place is not None:
            places[place] = places.get(place, 0) + need
    check_room(places, THEN)


def write_fault(err: BaseException, folder: Path) -> BaseException | None:
    """The folder's one line (a WriteFault) for `err` or any error it was raised from, where one
    says the disk is full or read-only; else, when `folder`'s filesystem is full now, that line;
    else None."""
    seen: set[int] = set()
    found: BaseException | None = err
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        if isinstance(found, WriteFault):  # written by outputs.write_json: a stage's fix
            return WriteFault(found.errno, str(found).replace(RERUN, THEN))
        where = Path(getattr(found, "filename", None) or folder)
        fault = write_failure(where.parent if where != folder else folder, found, THEN)
        if isinstance(fault, WriteFault):
            return fault
        found = found.__cause__ or found.__context__
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free < FULL_BYTES:
        return write_failure(folder, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), THEN)
    return None
