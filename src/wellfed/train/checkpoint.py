"""The checkpoint layout, named once: what one training checkpoint directory holds.

    model.pt          the model's state dict (unwrapped from DDP; LoRA adapters unmerged, so a
                      resume goes on training them): the weights, stored once
    optim.pt          optimizer, LR scheduler and GradScaler state; not in a run's final
                      checkpoint (the last step, or early stopping), which never trains on
    train_state.json  step, epoch and sampler position, the per-step history so far and the
                      best validation so far (train/selection.py)
    val_logits.npy    one worker, a step that validated: every validation row's logits, in
                      file order (the export's threshold and calibration use them)
    profile/          the final checkpoint only, when train.profile_steps is set: the trace
    manifest.json     every other file's size and sha256, written last (train/store.py)
    registered        written by the driver once it has the checkpoint's report (train/store.py)
    hf_model/         a completed run's kept checkpoint only, instead of model.pt and optim.pt:
                      hard links to the exported model's files (train/store.py, `complete`)

The exported Hugging Face model (data/model) is made from model.pt (train/export.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from wellfed.train.state import TrainState

MODEL = "model.pt"
OPTIM = "optim.pt"
STATE = "train_state.json"
VAL_LOGITS = "val_logits.npy"
PROFILE = "profile"
MANIFEST = "manifest.json"
REGISTERED = "registered"
HF_MODEL = "hf_model"
RERUN = ("rerun `dvc repro`: it checks the checkpoints against their manifests and resumes from "
         "the newest good one (delete this one first if it passes)")


class Damaged(Exception):
    """A checkpoint that cannot be read: str() names its folder and what failed, in one line."""


def unwrap(model):
    return getattr(model, "module", model)


def save(directory: Path, s, state: TrainState, final: bool, profile_dir: Path | None,
         val_logits: np.ndarray | None = None) -> None:
    """Write the checkpoint of Setup `s` (its model, optimizer, scheduler, scaler) and `state`;
    a `final` one without the optimizer's state (2x the weights with Adam), which nothing
    would read: a resume from it trains no further step, and a completed run drops it."""
    torch.save(unwrap(s.model).state_dict(), directory / MODEL)
    if not final:
        torch.save({"optimizer": s.optimizer.state_dict(), "scheduler": s.scheduler.state_dict(),
                    "scaler": s.scaler.state_dict()}, directory / OPTIM)
    (directory / STATE).write_text(json.dumps(state.to_json()))
    if val_logits is not None:
        np.save(directory / VAL_LOGITS, val_logits)
    if final and profile_dir and any(profile_dir.iterdir()):
        shutil.copytree(profile_dir, directory / PROFILE)


def save_hf(model, directory: Path) -> None:
    """`model` (unwrapped) as a Hugging Face model directory. LoRA: the adapters are folded into
    the base weights (W + alpha/r x BA), so the export is a plain transformers model that loads
    without peft; in place, without a copy (a 7B model would need another 14 GB), so `model` is
    merged afterwards."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.save_pretrained(directory, safe_serialization=True)


def weights(directory: Path) -> dict:
    """The state dict in `directory`'s model.pt; Damaged in one line when torch cannot read it."""
    try:
        # weights_only=True: a checkpoint never gets to run code on load.
        return torch.load(directory / MODEL, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError) as err:
        raise Damaged(f"checkpoint {directory}: {MODEL} cannot be read ({one_line(err)}); "
                      f"{RERUN}") from None


def load(directory: Path, s, metric: str, finished=lambda state: False) -> TrainState:
    """Restore Setup `s` from a checkpoint; return its training state (a checkpoint from before
    best tracking gets a fresh record for `metric`). A final checkpoint has no optimizer state:
    `finished(state)` says the run trains no further step from it."""
    unwrap(s.model).load_state_dict(weights(directory))
    if not (directory / OPTIM).exists() and finished(read_state(directory, metric)):
        return read_state(directory, metric)
    try:
        optim = torch.load(directory / OPTIM, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError) as err:
        raise Damaged(f"checkpoint {directory}: {OPTIM} cannot be read ({one_line(err)}); "
                      f"{RERUN}") from None
    s.optimizer.load_state_dict(optim["optimizer"])
    s.scheduler.load_state_dict(optim["scheduler"])
    s.scaler.load_state_dict(optim["scaler"])
    return read_state(directory, metric)


def read_state(directory: Path, metric: str | None = None) -> TrainState:
    return TrainState.from_json(json.loads((directory / STATE).read_text()), metric)


def one_line(err: BaseException) -> str:
    """torch's reading errors run to 5 sentences of advice; the first says what failed."""
    text = str(err).strip().splitlines()
    return text[-1].split(". ")[0] if text else type(err).__name__
