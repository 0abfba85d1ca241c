"""Kill one stage process with SIGKILL (the OOM killer, `kill -9`, a node lost) right after a
named call returns, once: on PYTHONPATH, Python imports this at start-up (site.py), before the
stage's own code.

$WELLFED_KILL is `<script>:<module>:<attribute>`, e.g.
`stages/train.py:wellfed.track.registry:register`: in a process running a script whose path
ends with <script>, <module>'s <attribute> (a function, or Class.method) is wrapped so that the
process kills itself when the call returns. $WELLFED_KILL_MARK names a file made just before the
kill; while it exists nothing is wrapped, so the rerun runs whole.
"""

from __future__ import annotations

import os
import sys

SPEC, MARK = os.environ.get("WELLFED_KILL"), os.environ.get("WELLFED_KILL_MARK")


def _wrap() -> None:
    import functools
    import importlib
    import signal

    script, module, attribute = SPEC.split(":")
    if not (sys.argv and sys.argv[0].endswith(script)):
        return
    if module.split(".")[0] == "mlflow":  # the stage's own order: telemetry off, then mlflow
        from wellfed import privacy

        privacy.apply()
    owner = importlib.import_module(module)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, name)

    @functools.wraps(real)
    def then_killed(*args, **kwargs):
        out = real(*args, **kwargs)
        with open(MARK, "w") as mark:
            mark.write(f"{attribute} returned in {sys.argv[0]}\n")
        os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(owner, name, then_killed)


if SPEC and MARK and not os.path.exists(MARK):
    _wrap()
