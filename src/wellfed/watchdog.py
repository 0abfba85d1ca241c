"""A stage never outlives the dvc that runs it.

dvc runs a stage through a shell (`$SHELL -c '<cmd>'`: bash execs the one command, dash forks
it), waits for it, and then records its outputs in dvc.lock. A dvc killed alone (SIGTERM or
SIGKILL to its pid, not to its process group) used to leave the stage running: a train stage
went on to completion and registered a model version that no dvc.lock recorded, and the rerun
trained it again into a second MLflow run.

So a stage that dvc runs (DVC_STAGE set) watches, from a thread, for dvc going away: its own
parent, and dvc behind a `-c` shell, are looked at every POLL_S, and a process re-parented
(to init or a subreaper) is one whose parent died. What the stage then does:
- while it trains (train/checkpoints/preemption.py's `run_stoppable` sets `requests_to`), the
  watchdog asks for the stop in-process, not with a signal: training checkpoints and stops as on
  preemption, and a stop already under way goes on as it was. The documented SIGTERM goes to dvc's
  process group, the stage included, and dvc dies of it at once: its death is that same request. (A
  second SIGTERM sent here used to read as "stop at once": the steps since the last periodic
  checkpoint were lost and the MLflow run was left RUNNING.) So it stays once training has stopped:
  what is left is the stop's line and Ray's shutdown, during which Ray gives SIGTERM its default
  action back, and a signal would end the stage before it said where it stopped.
- any other time, and in the other stages, it says so and sends itself SIGTERM: they stop at
  once (their outputs are atomic: nothing half-written stays as an output).
- once training is over, the train stage only finishes its outputs (seconds):
  `finish_when_orphaned` turns the stop off, and the completed run is recorded as orphaned
  (train/run/runs.py), so that the rerun finds it in place and trains nothing.
A stage run by hand is not watched: a parent that exits (nohup, a script) is no reason to stop.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable

POLL_S = 1.0
"""How often the parents are looked at (two reads of /proc; the stage stops within this)."""

_state: dict = {"finish": False, "orphaned": False, "dvc": 0, "request": None}


def parent_of(pid: int) -> int | None:
    """`pid`'s parent, from /proc (None where there is no /proc, or no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])  # after the (command name)
    except (OSError, ValueError, IndexError):
        return None


def runs_a_command(pid: int) -> bool:
    """Whether `pid` is a shell running one command line, as dvc starts a stage: its last two
    arguments are `-c` and the line (`sh -c '<cmd>'`, `bash --noprofile --norc -c '<cmd>'`)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return False
    return len(args) >= 3 and args[-2] == b"-c"


def watch() -> None:
    """Under dvc, start watching for it to go away (see the module docstring); else nothing.
    Once per process (cli.guarded runs a stage, then writes its time budget)."""
    if "DVC_STAGE" not in os.environ or _state["dvc"]:
        return
    parent = os.getppid()
    grand = parent_of(parent) if runs_a_command(parent) else None
    _state["dvc"] = grand or parent
    threading.Thread(target=_poll, args=(parent, grand), name="wellfed-watchdog",
                     daemon=True).start()


def _poll(parent: int, grand: int | None) -> None:
    while os.getppid() == parent and (grand is None or parent_of(parent) == grand):
        time.sleep(POLL_S)
    _state["orphaned"] = True
    what = f"dvc (pid {_state['dvc']}) is gone"
    if _state["finish"]:
        print(f"[wellfed] {what}: training is done, so this stage finishes its outputs; a rerun "
              "of `dvc repro` finds them and records them", file=sys.stderr, flush=True)
        return
    if (request := _state["request"]) is not None:
        request(what)  # the one who asked says what it makes of it (a stop, or the same one)
        return
    print(f"[wellfed] {what}: stopping this stage as on SIGTERM", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


def requests_to(request: Callable[[str], None] | None) -> None:
    """From now on dvc going away calls `request(what)` (from the watchdog's thread; `what`
    reads `dvc (pid 4821) is gone`) instead of sending this process SIGTERM; None: SIGTERM
    again. Once gone, dvc stays gone: it is called at most once per process."""
    _state["request"] = request


def finish_when_orphaned() -> None:
    """From now on dvc going away lets the stage finish (what is left is its outputs)."""
    _state["finish"] = True


def orphaned() -> bool:
    """Whether the dvc that ran this stage has gone away."""
    return _state["orphaned"]
