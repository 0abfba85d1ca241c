"""The Ray Tune callback that hands Tune's events to a search's story (search/story.py).

A class of its own module, not one made inside a function: Ray Tune keeps its callbacks in its
saved state (`tuner.pkl`), and a class made in a function is pickled with its code, which a
resumed search would have to run; this one is pickled by its name, so the state holds no code
(search/tune_state.py refuses a state that does).

A trial that fails (its Ray worker lost mid-trial, an error in the loop) is said in one line of
ours: Ray Tune's own 17-line traceback per failure is off (TUNE_PRINT_ALL_TRIAL_ERRORS=0,
search/tuning.py), the traceback stays in the trial's error file.
"""

from __future__ import annotations

from pathlib import Path

from ray import tune

from wellfed.cli import one_line
from wellfed.search import room


class StoryCallback(tune.Callback):
    def __init__(self, story):
        self.story = story

    def on_trial_start(self, iteration, trials, trial, **info):
        self.story.start(trial.trial_id, trial.config)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.story.result(trial.trial_id, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.story.complete(trial.trial_id)

    def on_step_end(self, iteration, trials, **info):
        room.SYNC.raise_found(self.story.folder)  # Ray's copy of Tune's state found no room

    def on_trial_recover(self, iteration, trials, trial, **info):
        print(f"[wellfed] {self.story.phase} trial {trial.trial_id}: {reason(trial)}; Ray Tune "
              "starts it again from its first step (once), into the same child run", flush=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        where = str(getattr(trial, "error_file", "") or "")
        self.story.error(trial.trial_id, where)
        print(f"[wellfed] {self.story.phase} trial {trial.trial_id} failed: {reason(trial)}; "
              f"its child run is FAILED (the traceback: {where or 'none kept'})", flush=True)


def reason(trial) -> str:
    """What ended a trial's run, in a line: its worker lost, or the error the trial raised (the
    last line of its error file that names an exception)."""
    try:
        text = Path(trial.error_file).read_text(encoding="utf-8", errors="replace")
    except (OSError, TypeError):
        return "it failed (no error file)"
    if "ActorDiedError" in text or "worker process has died" in text or "RayActorError" in text:
        return "its Ray worker died mid-trial (killed, or out of memory)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line.split(":")[0]
             or "Exception" in line.split(":")[0]]
    return one_line((named or lines or ["it failed"])[-1])
