"""One search per project at a time, and whom a busy DVC lock belongs to.

Two searches in one project used to both run: the final check trained twice into the same child
runs and the parent's `search/*` metrics were logged twice. A search now holds an exclusive
`flock` on `data/search/search.lock` from before `dvc repro tokenize` to its end; the file says
who holds it (pid, search id, start). The kernel releases the lock when the process ends however
it ends (SIGKILL, the OOM killer, a reboot), so a lock is never stale: a second search that
finds it free takes it, whatever the file still says. The file is never removed (removing a
locked file lets a third process lock a new one beside it).

`dvc_busy` turns DVC's own lock message (`'…/data/reports/tokens.json' is busy, it is being
blocked by:` and the pid and command on the next lines, dvc/rwlock.py), which the search's
`dvc repro tokenize` meets beside a running `dvc exp run`, into one whole line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from pathlib import Path
from typing import Iterator

NAME = "search.lock"
_held: dict[Path, int] = {}  # folder -> the locked file's descriptor (this process)
_named: dict[Path, str] = {}  # folder -> the id of the search this process runs


@contextlib.contextmanager
def held(folder: Path) -> Iterator[None]:
    """Hold the project's search lock (in `folder`, `data/search`) for the block; raise the
    one line naming the search that holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise ValueError(busy_line(path, holder)) from None
    except BaseException:
        os.close(fd)
        raise
    key = folder.resolve()
    _held[key] = fd
    try:
        _write(fd, {"pid": os.getpid(), "search_id": None, "started": time.time()})
        yield
    finally:
        _held.pop(key, None)
        _named.pop(key, None)
        os.close(fd)  # releases the lock


def name(folder: Path, search_id: str) -> None:
    """Say in the lock file which search this process runs (once its id is known)."""
    fd = _held.get(folder.resolve())
    if fd is not None:
        _named[folder.resolve()] = search_id
        holder = _read(fd)
        _write(fd, {**holder, "search_id": search_id})


def current(folder: Path) -> str | None:
    """The id of the search this process runs under `folder` (None before it is known)."""
    return _named.get(folder.resolve())


def busy_line(path: Path, holder: dict) -> str:
    pid = holder.get("pid")
    what = f"search {holder['search_id']}" if holder.get("search_id") else \
        "a search still preparing its token files"
    since = (f", started {time.strftime('%H:%M:%S', time.localtime(holder['started']))}"
             if holder.get("started") else "")
    who = f"pid {pid}" if pid else f"a process that holds {path}"
    stop = f"`kill -TERM {pid}`" if pid else "Ctrl-C in its terminal"
    return (f"another wellfed-search runs in this project ({who}, {what}{since}); one search "
            f"at a time per project: wait for it to finish, or stop it ({stop}: it saves where "
            "it is), then rerun `wellfed-search`")


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode("utf-8", "replace")
    try:
        found = json.loads(text)
    except ValueError:  # written half-way by a process killed at that instant: nothing known
        return {}
    return found if isinstance(found, dict) else {}


def _write(fd: int, holder: dict) -> None:
    data = (json.dumps(holder) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


BLOCKER = re.compile(r"\(PID (\d+)\): (.*)")
BUSY = re.compile(r"'(.+?)' is busy, it is being blocked by:")


def dvc_busy(output: str, root: Path, then: str) -> str | None:
    """DVC's `… is busy, it is being blocked by:` (a stage's rwlock, held by another dvc
    process) as one whole line naming the path (relative to the project), who holds it and what
    to run; None when `output` says something else."""
    match = BUSY.search(output)
    if not match:
        return None
    path = Path(match.group(1))
    with contextlib.suppress(ValueError):
        path = path.relative_to(root.resolve())
    return in_use(path, [(int(pid), cmd) for pid, cmd in BLOCKER.findall(output)], then)


def in_use(path, holders: list[tuple[int, str]], then: str) -> str:
    who = ", ".join(f"`{cmd.strip()}` (pid {pid})" for pid, cmd in holders)
    return (f"{path} is in use by {who or 'another dvc process'}, which runs the pipeline in "
            f"this project: wait for it to finish (or stop it), {then}")


def dvc_holder(root: Path, then: str) -> str | None:
    """The same line from DVC's own lock file (.dvc/tmp/rwlock: each path a running dvc
    process reads or writes, with its pid and command), for a dvc command whose output went
    to the terminal; None when no live process other than this one holds a path there."""
    from wellfed.outputs import running

    try:
        held = json.loads((root / ".dvc" / "tmp" / "rwlock").read_text())
    except (OSError, ValueError):
        return None
    entries = [(path, info) for path, info in held.get("write", {}).items()]
    entries += [(path, info) for path, infos in held.get("read", {}).items() for info in infos]
    for path, info in entries:
        pid = info.get("pid") if isinstance(info, dict) else None
        if isinstance(pid, int) and pid != os.getpid() and running(pid):
            with contextlib.suppress(ValueError):
                path = str(Path(path).relative_to(root.resolve()))
            return in_use(path, [(pid, str(info.get("cmd", "dvc")))], then)
    return None
