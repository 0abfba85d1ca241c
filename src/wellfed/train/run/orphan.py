"""A training run that completed after the dvc running it had gone: kept for the rerun to hand
to dvc, instead of a second training into a second MLflow run and model version.

When dvc goes away once training is over, the train stage finishes its outputs
(wellfed/watchdog.py), but no dvc.lock records them, and dvc removes a stage's outputs before it
runs the stage again. So such a completion keeps, in its run folder, a copy of the outputs (hard
links: no bytes, where the run folder shares their filesystem) and a digest of everything they
came from (`inputs_digest`: every param, the token folder, wellfed's code and the stage
script). The rerun's train stage, given the same inputs, puts the copy back and ends (`Recorded`,
its line); dvc then records the outputs and goes on to evaluate. A completion dvc saw is not
kept: `dvc repro -f` trains again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from wellfed.disk import link_tree

KEPT = "outputs"
"""The run folder's copy of the outputs (one numbered folder per output path)."""


class Recorded(Exception):
    """The run completed after its dvc had gone, with these inputs; its outputs are back in
    place: nothing to train. str() is the stage's line."""


def inputs_digest(recipe: str, params: dict, tokens_dir: Path) -> str:
    """What a train stage's outputs come from beyond the `recipe` hash (train/model params and
    the train and validation token files): every param (ray.*, data.*, mlflow.* too), the token
    folder's other files but the test split (labels, tokenizer), and wellfed's code with the
    stage script."""
    import wellfed

    code = sorted(Path(wellfed.__file__).parent.rglob("*.py"))
    script = Path(sys.argv[0])
    skip = {"train.arrow", "validation.arrow", "test.arrow"}
    small = sorted(p for p in tokens_dir.rglob("*") if p.is_file() and p.name not in skip)
    h = hashlib.sha256(json.dumps([recipe, params], sort_keys=True, default=str).encode())
    for path in code + ([script] if script.is_file() else []) + small:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def keep(run_dir: Path, outputs: list[str]) -> None:
    """Copy the output folders into `run_dir`/KEPT, as hard links where it can."""
    kept = run_dir / KEPT
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    for i, out in enumerate(map(Path, outputs)):
        if not link_tree(out, kept / str(i)):  # another filesystem: a copy
            shutil.copytree(out, kept / str(i))


def restore(run_dir: Path, outputs: list[Path]) -> bool:
    """Put the kept copy back, file by file (a file in place is replaced; others stay, dvc's
    .gitignore among them); False when there is no whole copy to put back."""
    kept = run_dir / KEPT
    if not all((kept / str(i)).is_dir() for i in range(len(outputs))):
        return False
    for i, out in enumerate(outputs):
        source = kept / str(i)
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            target = out / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            try:
                os.link(path, target)
            except OSError:  # another filesystem
                shutil.copy2(path, target)
    return True


def found(saved: dict, inputs: str | None, run_dir: Path, outputs: list[Path],
          name: str) -> None:
    """Raise `Recorded` (after putting the outputs back) when the run file `saved` is of a
    completion no dvc saw, with these `inputs`, and its copy is whole; else return."""
    if not (saved.get("orphaned") and inputs and saved.get("inputs") == inputs and outputs
            and restore(run_dir, outputs)):
        return
    model = saved.get("model") or {}
    version = (f", models:/{model['registered_model']}/{model['model_version']}"
               if model.get("model_version") else "")
    raise Recorded(f"run {name} already completed with these inputs (MLflow run "
                   f"{saved.get('mlflow_run_id')}{version}) after the dvc running it had gone: "
                   f"its outputs are back in place, nothing to train, dvc records them now "
                   f"(delete {run_dir} to train it again)")
