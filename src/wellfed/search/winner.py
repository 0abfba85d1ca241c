"""The winner becomes an ordinary DVC experiment: `dvc exp run -S ...` with its recipe, the
search's budget and the final check's first seed, trained, evaluated and registered by the
ordinary pipeline (`@champion` moves to it only by merit, on the test split, as for any run).

Its warm trial with the same recipe and seed trained the same steps on the same batches, so
the pipeline's last validation loss must equal the trial's; `equal_learning` says whether it
did (the check the search's speed claim rests on).
"""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path


def exp_name(search_id: str) -> str:
    return f"{search_id}-winner"


def command(name: str, params: dict) -> list[str]:
    """`dvc exp run --name NAME -S key=value ...` for the winner's params."""
    cmd = ["dvc", "exp", "run", "--name", name]
    for key, value in params.items():
        cmd += ["-S", f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}"]
    return cmd


def exists(name: str, cwd: Path) -> bool:
    found = subprocess.run(["dvc", "exp", "list", "--name-only"], cwd=cwd, capture_output=True,
                           text=True)
    return name in found.stdout.split()


def run(name: str, params: dict, cwd: Path) -> int:
    """Run the winner's experiment in the workspace, its console (the stages' progress bars,
    a stop's lines) on this terminal as it goes."""
    cmd = command(name, params)
    print(f"[wellfed] the winner as a DVC experiment: {' '.join(cmd)}", flush=True)
    return subprocess.call(cmd, cwd=cwd, stdout=sys.stdout, stderr=sys.stderr)


def failed(code: int, cwd: Path, result: Path) -> str:
    """The one line for a winner's `dvc exp run` that failed: another dvc process holding the
    pipeline (DVC's lock file names it), else the exit code."""
    from wellfed.search.lock import dvc_holder

    then = f"then run the winner with the command above (its params: {result})"
    busy = dvc_holder(cwd, then)
    if busy:
        return f"the winner's `dvc exp run` could not run: {busy}"
    return f"the winner's `dvc exp run` failed (exit {code}); its params are in {result}"


def last_validation(train_dir: Path) -> tuple[int, float] | None:
    """(step, val/loss) of the pipeline run's last validation (data/train/history)."""
    path = train_dir / "history" / "validation.csv"
    if not path.is_file():
        return None
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows or "val_loss" not in rows[-1]:
        return None
    return int(rows[-1]["step"]), float(rows[-1]["val_loss"])


def equal_learning(pipeline: tuple[int, float] | None, trial: dict | None) -> dict:
    """The pipeline run's last val/loss against the warm trial's at the same step."""
    if pipeline is None or trial is None or "val/loss" not in trial:
        return {"checked": False, "text": "no validation loss to compare"}
    step, loss = pipeline
    gap = abs(loss - float(trial["val/loss"]))
    same = step == int(trial["step"]) and gap <= 1e-4 * max(1.0, abs(loss))
    return {"checked": True, "same": same, "step": step, "pipeline_val_loss": loss,
            "trial_val_loss": float(trial["val/loss"]), "gap": gap,
            "text": (f"the pipeline's run reached val/loss {loss:.6f} at step {step}, its warm "
                     f"trial {float(trial['val/loss']):.6f} at step {int(trial['step'])}: "
                     + ("the same learning" if same else "DIFFERENT learning")
                     + f" (gap {gap:.1e})") if not math.isnan(loss) else "no finite loss"}
