"""How a training failure reads: one line, the workers' own message, where the traceback is."""

from __future__ import annotations

from wellfed.errors import StageError
from wellfed.outputs import WriteFault
from wellfed.train.checkpoints.checkpoint import Damaged

RAY_LOGS = "Ray's logs under /tmp/ray/session_latest/logs"


class TrainingFailed(StageError):
    """Training stopped on the workers; the message is the workers' own, in one line."""

    unplaced: int = 0
    """How many workers Ray Train could not place when it gave up (its starts of the group
    timed out: a node lost, or its room held); 0 = another failure (train/run/lost_node.py)."""


STARTUP_TIMEOUT = "WorkerGroupStartupTimeoutError"
"""The controller failure Ray Train gives up with when it cannot place the worker group: named,
not imported (its class is not in Ray's public API)."""


def not_placed(err: BaseException) -> int:
    """The workers a Ray Train ControllerError says could not be placed (0: not that failure)."""
    cause = getattr(err, "controller_failure", None)
    if type(cause).__name__ != STARTUP_TIMEOUT:
        return 0
    return int(getattr(cause, "num_workers", 0) or 1)


def worker_failure(err: Exception) -> TrainingFailed:
    """Ray's TrainingFailedError -> one line: each failed worker's own message; a group Ray
    could not place carries how many workers it asked for (`unplaced`)."""
    failure = worker_failures(err)
    failure.unplaced = not_placed(err)
    return failure


def worker_failures(err: Exception) -> TrainingFailed:
    failures = getattr(err, "worker_failures", None) or {}
    causes = [getattr(exc, "cause", None) or exc  # Ray wraps the user exception
              for _, exc in sorted(failures.items())]
    complete = [str(c) for c in causes if isinstance(c, (WriteFault, Damaged))]
    if complete:  # says the folder and the fix itself
        return TrainingFailed(complete[0])
    detail = "; ".join(cause_line(rank, cause) for rank, cause in zip(sorted(failures), causes))
    return failed(detail or str(err).strip().splitlines()[-1], RAY_LOGS)


def cause_line(rank: int, cause: BaseException) -> str:
    text = str(cause).strip().splitlines()
    return f"worker {rank}: {type(cause).__name__}: {text[-1] if text else ''}"


def failed(detail: str, traceback_at: str) -> TrainingFailed:
    return TrainingFailed(f"training failed ({detail}); the last good checkpoint is kept and a "
                          "rerun of `dvc repro` resumes from it. Full traceback: "
                          f"{traceback_at}")


def message(rank: int, err: BaseException, traceback_at: str) -> str:
    """The one line for `err` raised on worker `rank`: a fault's own (it names the folder and
    the fix), else `failed`'s."""
    if isinstance(err, (WriteFault, Damaged)):
        return str(err)
    return str(failed(cause_line(rank, err), traceback_at))
