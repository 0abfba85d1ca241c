"""Stage entry points: user mistakes become one clear line on stderr and exit code 1."""

from __future__ import annotations

import functools
import logging
import os
import sys

from wellfed import privacy


def stage(main):
    """Wrap a stage's main(*argv): usage check, logging, one-line errors for bad input."""

    @functools.wraps(main)
    def run() -> None:
        privacy.apply()  # before mlflow and ray are imported (the stages import them lazily)
        logging.basicConfig(level=logging.INFO, format="[wellfed] %(message)s")
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
