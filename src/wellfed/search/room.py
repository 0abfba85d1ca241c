"""A search's disk, checked as a stage checks its own: before any trial, every folder the search
writes into takes a file and has room for it (outputs.check_room); a write that fails later (a
full or read-only folder, whichever library wrote: wellfed's ledger, Ray Tune's syncer) stops
the search with the same line, naming the folder and what to run.

A full disk mid-search used to end in 11 `No space left on device` tracebacks from Ray's syncer
and `unexpected TuneError`.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from wellfed.disk import write_failure
from wellfed.outputs import RERUN, UNWRITABLE, WriteFault, check_room

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


STATE_COPIES = 3
"""A fused trial's state at a rung (trials/resume.py): its weights and AdamW's two moments,
each the size of the model's fp32 weights."""


def state_bytes(fusable: bool, trials: int, source: str, held: Path | None = None) -> int:
    """What fused trials keep in the search folder at once: at a rung every trial of the search
    may have its slice there (weights and AdamW's moments: MiniLM's 90 MB weights make 270 MB a
    trial), less what `held` (a resumed search's groups/ folder) holds already; none where the
    trials train one at a time with ASHA (`fusable` False), which keep no state."""
    from wellfed.model import weight_bytes

    if not fusable:
        return 0
    kept = sum(p.stat().st_size for p in held.glob("*.pt")) if held and held.is_dir() else 0
    return max(0, trials * STATE_COPIES * weight_bytes(source) - kept)


def check(folder: Path, trials: int, store: Path | None, local_ray: bool,
          states: int = 0) -> None:
    """Before any trial: the search folder, a local MLflow store and local Ray's temp folder
    take a file and have room for `trials` trials (the search's and the final check's), and
    the folder for `states` bytes of fused trials' saved state (`state_bytes`)."""
    places: dict[Path, int] = {}
    for place, need in ((folder, trials * TRIAL_BYTES + states),
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


ERRNO = re.compile(r"\[errno (\d+)\]|OSError\((\d+),|\(os error (\d+)\)", re.IGNORECASE)


class SyncFaults(logging.Filter):
    """On Ray Tune's syncer's logger: each failed copy of Tune's state into the search folder is
    logged with its traceback, at every turn of Tune's loop (11 of them before Tune gave up, on
    a full disk). A copy that failed for want of room or access is kept instead (the first) and
    not logged; the search stops with the folder's line at the next turn (`raise_found`)."""

    def __init__(self):
        super().__init__()
        self.found: OSError | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        match = ERRNO.search(record.getMessage())
        code = int(next(g for g in match.groups() if g)) if match else None
        if code not in UNWRITABLE:
            return True
        self.found = self.found or OSError(code, os.strerror(code))
        return False

    def raise_found(self, folder: Path) -> None:
        if self.found is not None:
            found, self.found = self.found, None
            raise write_failure(folder, found, THEN)


SYNC = SyncFaults()
SYNC_LOGGER = "ray.train._internal.syncer"
"""Ray Tune's syncer's logger (a name, not an import: Ray's module is private)."""


def watch_sync() -> None:
    """Put SYNC on the syncer's logger (once)."""
    logger = logging.getLogger(SYNC_LOGGER)
    if SYNC not in logger.filters:
        logger.addFilter(SYNC)
