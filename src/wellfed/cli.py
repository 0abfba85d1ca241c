"""Stage entry points: user mistakes become one clear line on stderr and exit code 1."""

from __future__ import annotations

import functools
import logging
import os
import sys


def console() -> None:
    """The console is for people: wellfed's own lines at INFO, everyone else's at WARNING.

    MLflow installs its own handler at INFO when imported (database tables, system-metrics
    monitor); MLFLOW_LOGGING_LEVEL, read at that import here and in the Ray workers started
    from this process, keeps those lines off the console. Set it to INFO to see them again.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ours = logging.getLogger("wellfed")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[wellfed] %(message)s"))
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")


def stage(main):
    """Wrap a stage's main(*argv): usage check, logging, one-line errors for bad input."""

    @functools.wraps(main)
    def run() -> None:
        console()
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        args = sys.argv[1:]
        expected = main.__code__.co_argcount
        if len(args) != expected:
            names = " ".join(main.__code__.co_varnames[:expected])
            sys.exit(f"usage: {os.path.basename(sys.argv[0])} {names}")
        try:
            main(*args)
        except (ValueError, FileNotFoundError, PermissionError) as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(1)
        except RuntimeError as err:
            if type(err).__name__ != "TrainingFailed":  # anything else is a bug: keep the traceback
                raise
            print(f"error: {err}", file=sys.stderr)
            sys.exit(1)
        except OSError as err:
            where = f"{err.filename}: " if getattr(err, "filename", None) else ""
            print(f"error: {where}{err.strerror or err}; check free disk space and permissions",
                  file=sys.stderr)
            sys.exit(1)

    return run
