"""Stage entry points: every failure becomes one clear line on stderr and exit code 1.

A failure a person can act on (bad params or data, a missing file, a full disk, MLflow refusing
or unreachable, workers stopping) is printed as it is. Anything else is a bug in wellfed: one
line that says so, with the traceback kept in a file for the report instead of on the console.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import tempfile
import traceback
from pathlib import Path

from wellfed import heap, privacy, watchdog
from wellfed.errors import StageError
from wellfed.outputs import WriteFault

INTERRUPTED = ("stopped by Ctrl-C; stages already finished are kept: rerun `dvc repro` to go on "
               "from there")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C in a stage that can say more (where training stopped); str() is the line."""


USER_ERRORS = (StageError, ValueError, FileNotFoundError, PermissionError, WriteFault)
MAX_CHARS = 1000  # an MLflow server can answer with a whole HTML page


def one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 1] + "…"


def mlflow_error(err: BaseException) -> str | None:
    """For MLflow's errors: 'MLflow failed in tracking.send_metrics (called from evaluate.py line
    36): <MLflow's message>'; None for any other error."""
    exceptions = sys.modules.get("mlflow.exceptions")  # MLflow not imported: not MLflow's error
    if exceptions is None or not isinstance(err, exceptions.MlflowException):
        return None
    call, origin = "", ""
    for frame, line in traceback.walk_tb(err.__traceback__):
        module = frame.f_globals.get("__name__", "")
        if module.split(".")[0] == "mlflow":
            break  # the frames before this are ours: the last of them made the call
        file = os.path.basename(frame.f_code.co_filename)
        if module == "__main__":
            module, origin = os.path.splitext(file)[0], f"{file} line {line}"
        call = f"{module.rsplit('.', 1)[-1]}.{frame.f_code.co_name}"
    where = f" in {call} (called from {origin})" if origin else ""
    return f"MLflow failed{where}: {err}"


def message(err: Exception) -> str | None:
    """The one line to print for `err`, or None when it is a bug."""
    if (text := mlflow_error(err)) is not None:
        return text
    if isinstance(err, USER_ERRORS):
        return str(err)
    if isinstance(err, OSError):
        if err.errno is None:  # not the system's: a library's own sentence (transformers: no
            return str(err)    # such file in the model folder or the cache), said as it is
        where = f"{err.filename}: " if getattr(err, "filename", None) else ""
        return f"{where}{err.strerror or err}; check free disk space and permissions"
    return None


def bug_report(err: Exception, stage_name: str) -> str:
    """Save the traceback of an unexpected error; return the one line that points at it."""
    path = os.path.join(tempfile.gettempdir(), f"wellfed-{stage_name}-{os.getpid()}.traceback")
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(traceback.format_exception(err)))
        kept = f"the traceback is in {path}"
    except OSError:
        kept = "run it again with WELLFED_TRACEBACK=1 for the traceback"
    last = traceback.extract_tb(err.__traceback__)[-1:]
    at = f" at {os.path.basename(last[0].filename)}:{last[0].lineno}" if last else ""
    return (f"unexpected {type(err).__name__}{at}: {err}; this is a bug in wellfed, please "
            f"report it ({kept})")


class StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a line is logged, not when the handler was made
    (a test harness swaps and closes it between commands run in one process)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def console() -> None:
    """The console is for people: wellfed's own lines at INFO, everyone else's at WARNING.

    MLflow installs its own handler at INFO when imported (database tables, system-metrics
    monitor); MLFLOW_LOGGING_LEVEL, read at that import here and in the Ray workers started
    from this process, keeps those lines off the console. Set it to INFO to see them again.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ours = logging.getLogger("wellfed")
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter("[wellfed] %(message)s"))
    for old in [h for h in ours.handlers if isinstance(h, StderrHandler)]:
        ours.removeHandler(old)  # called again (a second command in one process): one line each
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")


def stage(main=None, *, work: str | None = None):
    """Wrap a stage's main(*argv): usage check, logging, every failure as one line, and the
    stage's time budget from process start (telemetry/budget.py): `--time PATH` after the
    paths writes it as JSON once the stage has succeeded, and one line of its biggest parts
    ends the stage. A main with a keyword-only `budget` gets it, to time its own parts;
    `work` names the part that is the stage's work (the rest is fixed cost)."""
    if main is None:
        return functools.partial(stage, work=work)

    @functools.wraps(main)
    def run() -> None:
        from wellfed.telemetry.budget import Budget, line, write

        args, time_path = time_option(sys.argv[1:])
        script = os.path.splitext(os.path.basename(sys.argv[0]))[0]
        budget = Budget.begin(Path(time_path).stem if time_path else script, work,
                              Path(time_path) if time_path else None)
        expected = main.__code__.co_argcount
        if len(args) != expected:
            names = " ".join(main.__code__.co_varnames[:expected])
            sys.exit(f"usage: {os.path.basename(sys.argv[0])} {names} [--time TIME_JSON]")
        wants = "budget" in main.__code__.co_varnames[expected:expected
                                                         + main.__code__.co_kwonlyargcount]
        guarded(lambda: main(*args, **({"budget": budget} if wants else {})))
        record = budget.record()
        if time_path:
            guarded(lambda: write(Path(time_path), record))
        print(f"[wellfed] {line(record)}", flush=True)
        for text in budget.after:
            print(f"[wellfed] {text}", flush=True)

    return run


def time_option(args: list[str]) -> tuple[list[str], str | None]:
    """argv without `--time PATH` (anywhere), and PATH (None when absent)."""
    if "--time" not in args:
        return args, None
    at = args.index("--time")
    if at + 1 >= len(args):
        sys.exit("usage: --time needs a path, e.g. --time data/reports/time/train.json")
    return args[:at] + args[at + 2:], args[at + 1]


def guarded(call, name: str | None = None) -> None:
    """Run a stage or command's `call()` with privacy and the console set up, every failure as
    one line (exit 1) and Ctrl-C as one line (exit 130)."""
    privacy.apply()  # before mlflow and ray are imported (the stages import them lazily)
    console()
    watchdog.watch()  # under dvc: stop (checkpointing) if dvc goes away
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        call()
        heap.settle()  # done: the interpreter's exit need not walk the heap (1-1.5 s)
    except KeyboardInterrupt as err:  # Ctrl-C: where it stopped and how to go on, one line
        print(f"[wellfed] {one_line(str(err)) or INTERRUPTED}", file=sys.stderr)
        sys.exit(130)
    except Exception as err:
        text = message(err)
        if text is None:
            if os.environ.get("WELLFED_TRACEBACK"):
                raise
            text = bug_report(err, name or os.path.splitext(os.path.basename(sys.argv[0]))[0])
        print(f"error: {one_line(text)}", file=sys.stderr)
        sys.exit(1)
