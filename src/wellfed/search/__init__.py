"""The search: an adaptive hyperparameter search on Ray Tune in warm trials, its winner proven
over seeds and made an ordinary DVC experiment (`wellfed-search`, docs/search.md).

command.py (the CLI) -> driver.py (plan, phases, verdict) -> tuning.py (Ray Tune) running
trial.py (the training loop, warm) in its workers; story.py puts it all in MLflow, rungs.py
says why ASHA stopped a trial, proof.py retrains the finalists over seeds and compares them,
winner.py hands the winner to `dvc exp run`, report.py says what was found.

What a search survives (docs/search.md, "Stopping and resuming"): lock.py keeps it one per
project, room.py checks its disk, endings.py leaves no run RUNNING, tune_state.py checks Ray
Tune's saved state like a checkpoint, tune_callback.py hands Tune's events to the story.
"""
