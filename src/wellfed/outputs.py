"""Atomic stage outputs: build in a temporary sibling, rename into place only when complete.

A stage that fails or is killed half-way therefore never leaves a file or directory that DVC or
the next stage could mistake for a finished output, and an older complete output stays intact
until the new one is ready. A stage killed outright (SIGKILL, a reboot) cannot clean up: its
staging copy stays, hidden (`data/.tokens.tmp-<pid>-<hex>/`, 3.3 MB at 200k rows), so the next
write of the same output removes the copies whose process is gone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterator


UNWRITABLE = {errno.EROFS: "is on a read-only file system", errno.EACCES: "is not writable",
              errno.EPERM: "is not writable", errno.ENOSPC: "is full",
              errno.EDQUOT: "is over its disk quota"}
"""The OSErrors of a folder that no retry fixes: a person has to make room or grant access."""


class WriteFault(OSError):
    """A folder that cannot be written (read-only, no permission, full); str() is the one line,
    naming the folder and the fix. Built by `write_fault`; pickles as an OSError (it crosses
    from a Ray worker to the driver)."""

    def __str__(self) -> str:
        return self.strerror


def unwritable(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in UNWRITABLE


def write_fault(folder, err: OSError, then: str, state: str | None = None) -> OSError:
    """`err` as a WriteFault naming `folder` (which `state`: by default what `err` says of
    it) and the fix, then `then` (what to rerun); an error that is not about room or access
    comes back as it is."""
    if not unwritable(err) or isinstance(err, WriteFault):
        return err
    fix = ("free some space (what each run keeps and how to remove it: README, \"Faults and "
           "resume\")" if err.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable")
    return WriteFault(err.errno, f"cannot write {folder}: it {state or UNWRITABLE[err.errno]} "
                                 f"([Errno {err.errno}] {err.strerror}); {fix}, {then}")


RERUN = "then rerun `dvc repro`"


def check_room(places: dict, then: str = RERUN) -> None:
    """Before a stage's first expensive step: every folder it will write into (`places`: folder
    -> the bytes it will get there, an estimate) takes a file, and every filesystem among them
    has room for what its folders will get together. A folder not made yet is judged by the
    nearest one above it, which the write would create it in. Raises the first problem's
    WriteFault line (the one a failed write would raise later, after the work)."""
    wanted: dict[int, list] = {}
    for folder, need in places.items():
        existing = Path(folder).absolute()
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():  # a file where a folder should be: as atomic_path says it
            raise OSError(f"{shown(existing)}: cannot create output directory (Not a "
                          "directory); check the path and its permissions")
        try:
            fd, probe = tempfile.mkstemp(prefix=".wellfed-probe-", dir=existing)
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            raise write_fault(shown(existing), err, then) from None
        place = wanted.setdefault(os.stat(existing).st_dev, [existing, 0])
        place[1] += int(need)
    for existing, need in wanted.values():
        free = shutil.disk_usage(existing).free
        if need > free:
            raise write_fault(shown(existing), OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                              then, f"has {free / 1e6:,.0f} MB free, and this stage will write "
                                    f"about {need / 1e6:,.0f} MB on its filesystem")


def shown(path: Path) -> str:
    """`path` relative to the working directory where it is under it (`data`), else whole."""
    try:
        return str(path.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(path)


# `.<name>.tmp-<pid>-<hex>` (being built) and `.<name>.old-<pid>-<hex>` (the output it replaces,
# removed right after the swap); names without the pid come from wellfed before it was added.
STAGING = re.compile(r"(tmp|old)-(?:(\d+)-)?[0-9a-f]{8}")


def staging_name(final: Path, kind: str) -> Path:
    """A hidden sibling of `final` that names the process writing it."""
    return final.parent / f".{final.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def running(pid: int) -> bool:
    """Whether a process with this id runs on this machine (signal 0 checks without sending)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_leftovers(final: str | Path) -> list[str]:
    """Remove the staging copies of `final` that a killed process left beside it (those of a
    process still running here stay: it may be writing the same output). Returns what was
    removed, with sizes, as `path (size)`."""
    final = Path(final)
    prefix = f".{final.name}."
    try:
        entries = [e for e in final.parent.iterdir() if e.name.startswith(prefix)]
    except OSError:  # no folder yet: nothing left over
        return []
    removed = []
    for entry in sorted(entries):
        match = STAGING.fullmatch(entry.name[len(prefix):])
        if not match or (match.group(2) and running(int(match.group(2)))):
            continue
        folder = entry.is_dir() and not entry.is_symlink()
        files = [p for p in entry.rglob("*") if p.is_file()] if folder else [entry]
        size = sum(p.lstat().st_size for p in files)
        if folder:
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        if not os.path.lexists(entry):
            removed.append(f"{entry} ({size / 1e6:.1f} MB)")
    return removed


@contextlib.contextmanager
def atomic_path(final: str | Path, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `final`; on success replace `final` with it. Staging
    copies of `final` left by a killed process are removed first, and said so."""
    final = Path(final)
    then = RERUN
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if unwritable(err):
            raise write_fault(final.parent, err, then) from None
        raise OSError(f"{final.parent}: cannot create output directory ({err.strerror}); "
                      "check the path and its permissions") from None
    removed = remove_leftovers(final)
    if removed:
        print(f"[wellfed] removed what an interrupted run left: {', '.join(removed)}", flush=True)
    tmp = staging_name(final, "tmp")
    try:
        if is_dir:
            tmp.mkdir()
    except OSError as err:
        raise write_fault(final.parent, err, then) from None
    try:
        yield tmp
        if final.is_dir() and not final.is_symlink():
            old = staging_name(final, "old")
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException as err:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        if unwritable(err):  # raised while writing into tmp or renaming it: the folder's fault
            raise write_fault(final.parent, err, then) from None
        raise


def write_json(path: str | Path, data) -> None:
    """Write `data` as pretty JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
