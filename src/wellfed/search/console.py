"""What a search says on the console before its trials, and what it keeps off it.

The console holds the search's own lines: the start line (what is searched, how many trials at
once, with ASHA or up to K per fused group x the groups side by side, where its files are), a
resume's "resuming: N of M finished", then one line when a trial starts, at each rung, and when
it ends (search/story.py). Ray Tune's warnings about its own loop (`The process_trial_result
operation took 0.6 s, which may be a performance bottleneck`: the driver logging a trial's
report to MLflow on a loaded machine) go to the search's `search.log` instead; each trial's own
output (the model's `Loading weights` bar, the training loop's lines) to
`trials/<trial id>.log`, a fused group's to `trials/<its trials' ids, joined by +>.log`
(search/fused.py). Ray Tune's errors still reach the console too.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
from pathlib import Path

LOG = "search.log"
"""Ray Tune's warnings, in the search's folder."""
TRIAL_LOGS = "trials"
"""Each trial's own output, `<trial id>.log`, in the search's folder."""


def at_once(concurrent: int, need: dict, trials: int) -> tuple[int, str]:
    """How many trials run at once (after Ray is up), and why, in words."""
    if concurrent:
        return min(concurrent, trials), "search.concurrent"
    import ray

    have = ray.cluster_resources()
    fits = [int(have.get("CPU", 0) // need["cpu"])]
    why = f"{have.get('CPU', 0):g} CPUs, ray.cpus_per_worker {need['cpu']:g} each"
    if need.get("gpu"):
        fits.append(int(have.get("GPU", 0) // need["gpu"]))
        why += f"; {have.get('GPU', 0):g} GPUs, ray.gpus_per_worker {need['gpu']:g} each"
    return max(1, min(min(fits), trials)), f"search.concurrent 0: as many as Ray fits ({why})"


def fused_at_once(k: int, fit: int, need: dict, concurrent: int,
                  trials: int) -> tuple[int, str]:
    """How many trials train at once in a fused search, up to `k` per group x the groups side
    by side (search/rounds.py's `slots`: at most search.concurrent of the `fit` Ray has room
    for, `need` each; no more than the first rung has), and why, in words."""
    groups = min(min(fit, concurrent) if concurrent else fit, math.ceil(trials / k))
    each = (f"a GPU and {need.get('num_cpus', 1)} CPU(s) each" if need.get("num_gpus") else
            f"{need.get('num_cpus', 1)} CPU(s) each")
    side = (f"search.concurrent {concurrent}" if concurrent and concurrent <= fit else
            f"search.concurrent {concurrent}, but Ray fits {fit}: {each}" if concurrent else
            f"search.concurrent 0: Ray fits {fit}, {each}")
    per = f"up to {k} per fused group" if k > 1 else "groups of one"
    return (min(k * groups, trials),
            f"{per} x {groups} group{'s' if groups != 1 else ''} side by side; {side}")


def resumed(folder: Path, search_total: int, proof_total: int) -> str | None:
    """"resuming ...: N of M finished" when the search's folder holds finished trials."""
    from wellfed.search.story import ledger

    done = ledger(folder)
    if not done:
        return None
    search = sum(1 for e in done.values() if e["phase"] == "search")
    proof = len(done) - search
    said = (f"resuming: {search} of {search_total} search trials finished" +
            (f", {proof} of {proof_total} final-check runs" if proof else "") +
            " (kept: handed back to Ray Tune, not trained again)")
    return said


class OneLine(logging.Formatter):
    """A Ray Tune error on the console as one line, its traceback left to the search's log (a
    SIGTERM that met Tune syncing its state printed a 30-line pyarrow traceback there)."""

    def __init__(self, log: Path):
        super().__init__()
        self.log = log

    def format(self, record: logging.LogRecord) -> str:
        first = record.getMessage().strip().splitlines()[:1]
        more = f" (the traceback: {self.log})" if record.exc_info or record.exc_text else ""
        return f"{record.levelname} {record.name}: {first[0] if first else ''}{more}"


def ray_tune_to_log(folder: Path) -> Path:
    """Ray Tune's log lines into `folder/search.log`, off the console; its errors on both,
    one line each on the console (OneLine).
    Called again (a second search in one process), it replaces the handlers it added."""
    from wellfed.cli import StderrHandler

    path = folder / LOG
    tune = logging.getLogger("ray.tune")
    for old in [h for h in tune.handlers if getattr(h, "wellfed_search", False)]:
        tune.removeHandler(old)
        old.close()
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    errors = StderrHandler()
    errors.setLevel(logging.ERROR)
    errors.setFormatter(OneLine(path))
    for handler in (to_file, errors):
        handler.wellfed_search = True
        tune.addHandler(handler)
    tune.propagate = False  # not through Ray's own console handler on the "ray" logger
    return path


@contextlib.contextmanager
def trial_output(log_dir: str, trial: str):
    """A trial's stdout and stderr into `log_dir/<trial>.log` (appended: a restarted trial
    keeps its first attempt's lines), else dropped when the folder cannot be written (a
    worker on another node)."""
    sink = io.StringIO()
    if log_dir:
        try:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            sink = open(Path(log_dir) / f"{trial}.log", "a", encoding="utf-8")
        except OSError:
            pass
    with sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield
