"""Ray Tune, through its public API: the search phase (Optuna's TPE proposes, ASHA stops) and
the final check (a fixed grid of finalist x seed), each resumable from its folder.

Both phases run the same trainable (search/trial.py) in warm workers (`reuse_actors`), placed
by Ray with `ray.cpus_per_worker` CPUs and, on a cluster with GPUs, `ray.gpus_per_worker` of a
GPU per trial. Tune's experiment state is saved at every turn of its loop and on a stop;
trials finished since are in the search folder's ledger (search/story.py), so a resumed phase
trains none of them again. Before a resume that state is checked like a checkpoint
(search/tune_state.py) and set aside when cut short or refused; the final check's grid is
never restored (it starts afresh, its finished trials handed back by their config).

Signals: Ray Tune stops gracefully on SIGUSR1, saving its state; SIGINT (Ctrl-C) and SIGTERM
(SLURM, a spot VM's notice) are turned into SIGUSR1 here, so every polite signal stops the same
way, and the command says how to resume. A second signal stops at once (KeyboardInterrupt).
A phase that ends short of its trials with no signal (Tune restored its state, then failed to
resume it) has that state set aside and runs once more from nothing.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

STATE_EVERY_S = "0"
"""TUNE_GLOBAL_CHECKPOINT_S: Tune saves the experiment's state (a few KB here) at every turn
of its loop, so that a search killed outright loses at most the turn under way: a trial that
finished in it is in the ledger (search/story.py) but not in Tune's state, and Tune proposes
one trial in its place (both are kept and ranked)."""


@dataclass(frozen=True)
class Phase:
    """One Tuner's run: its name (the folder under the search folder) and how it ended."""

    name: str
    interrupted: int | None
    """The signal that stopped it (None: it ran to its end)."""
    errors: list[str]
    """The trials that failed (after Ray Tune's retry), each as Tune's error in one line."""


def environment() -> None:
    """Before Ray Tune is imported: its state saved often, no per-trial CSV/TensorBoard/JSON
    loggers (the MLflow child runs hold every figure), no progress table (the command prints
    one line per trial)."""
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", STATE_EVERY_S)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Ctrl-C is caught by run_phase, as SIGTERM is, so that it knows a stop from a phase that
    # ended short for another reason; Tune's SIGUSR1 handler does the graceful stop.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    # A failed trial is said in one line by the search (search/tune_callback.py), not in Ray
    # Tune's 17-line traceback: that stays in the trial's error file.
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    import logging

    # Tune's ResultGrid reads each trial's metrics from the per-trial loggers turned off
    # above, and warns once per trial that it found none: the ledger holds them instead.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # On a stop, Tune warns that it got the signal and how to resume through its own API; the
    # command says both in wellfed's words (resume = the same command).
    logging.getLogger("ray.tune.tune").setLevel(logging.ERROR)
    # A full or read-only search folder under Ray's syncer: the search's line, not a traceback
    # per turn of Tune's loop (search/room.py).
    from wellfed.search import room

    room.watch_sync()
    import warnings

    # A trial restarted by a resume reports its first rungs again: Optuna keeps the first
    # values (the same, same seed) and warns per step.
    warnings.filterwarnings("ignore", message="The reported value is ignored because")


def checked(path: Path, restore: bool) -> None:
    """Before a phase starts: Ray Tune's saved state in `path` is checked like a checkpoint
    (search/tune_state.py), and set aside in one line when cut short or refused. A phase that
    is not restored (`restore` False) has its old state removed unread."""
    import shutil

    from wellfed.search import tune_state

    if not path.is_dir():
        return
    if not restore:
        shutil.rmtree(path)
        return
    why = tune_state.fault(path)
    if why is not None:
        set_aside(path, why)


def set_aside(path: Path, why: str) -> None:
    from wellfed.outputs import shown
    from wellfed.search import tune_state

    aside = tune_state.set_aside(path)
    print(f"[wellfed] Ray Tune's state of this phase cannot be used ({why}): set aside as "
          f"{shown(aside)}; the phase starts again, and the trials it finished are handed back "
          "from data/search's ledger, not trained again", flush=True)


def resources(cpus: int, gpus: float) -> dict:
    return {"cpu": cpus, "gpu": gpus} if gpus else {"cpu": cpus}


def run_phase(name: str, folder: Path, trainable, need: dict, callback, *,
              param_space: dict | None = None, searcher=None, scheduler=None,
              metric: str | None = None, mode: str | None = None, samples: int = 1,
              expected: int = 1, concurrent: int = 0, done=lambda: 0,
              restore: bool = True) -> Phase:
    """Run (or resume) the Tuner `name` under `folder`: `samples` trials drawn by `searcher`
    (or once `param_space`'s grid), at most `concurrent` at once (0: as many as Ray fits).
    It ran to its end when the `expected` trials either finished (`done()` counts the
    ledger's) or failed. Without `restore` (a fixed grid) a stopped phase starts afresh: the
    trials it finished are handed back from the ledger, Tune's state is not read."""
    from ray import tune

    from wellfed.cli import one_line

    fn = tune.with_resources(trainable, need)
    path = folder.resolve() / name
    checked(path, restore)
    received: list[int] = []

    def polite(signum, frame):  # SIGINT, SIGTERM -> Tune's graceful stop (its SIGUSR1)
        if received:  # the second: at once
            raise KeyboardInterrupt
        received.append(signum)
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = {s: signal.signal(s, polite) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for _ in range(2):
            tuner = restored = None
            if restore and tune.Tuner.can_restore(str(path)):
                try:
                    tuner = tune.Tuner.restore(str(path), trainable=fn, resume_unfinished=True,
                                               resume_errored=False, restart_errored=True)
                    restored = True
                except Exception as err:  # whole and allowed, yet not Tune's (another Ray's)
                    set_aside(path, f"Ray Tune could not restore it: {one_line(str(err))}")
            if tuner is None:
                tuner = tune.Tuner(
                    fn, param_space=param_space or {},
                    tune_config=tune.TuneConfig(
                        search_alg=searcher, scheduler=scheduler, metric=metric, mode=mode,
                        num_samples=samples, max_concurrent_trials=concurrent or None,
                        reuse_actors=True),
                    run_config=tune.RunConfig(name=name, storage_path=str(folder.resolve()),
                                              callbacks=[callback], verbose=0,
                                              failure_config=tune.FailureConfig(max_failures=1)))
            grid = tuner.fit()
            errors = [one_line(str(r.error)) for r in grid if r.error]
            ended = done() + len(errors) >= expected
            if ended or received or not restored or not path.is_dir():
                break
            # Short of its trials with no signal: Tune failed to read the restored run's state
            # (its "Failed to restore the run state", logged in search.log) and ran its
            # restored searcher out. Once more from nothing, the finished trials handed back.
            set_aside(path, "Ray Tune restored it but could not resume its trials")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    stopped = None if ended else (received[0] if received else signal.SIGINT)
    return Phase(name, stopped, errors)
