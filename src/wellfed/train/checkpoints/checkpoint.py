"""The checkpoint layout, named once: what one training checkpoint directory holds (store.py
here is train/checkpoints/store.py).

    model.pt          the model's state dict (unwrapped from DDP; LoRA adapters unmerged, so a
                      resume goes on training them): the weights, stored once
    optim.pt          optimizer, LR scheduler and GradScaler state, and every rank's random
                      generators (random_state.py here: tensors and numbers, no pickle); not
                      in a run's final checkpoint (the last step, or early stopping), which
                      never trains on
    train_state.json  step, epoch and sampler position, the per-step history so far and the
                      best validation so far (train/step/selection.py)
    val_logits.npy    one worker, a step that validated: every validation row's logits, in
                      file order (the export's threshold and calibration use them)
    profile/          the final checkpoint only, when train.profile_steps is set: the trace
    manifest.json     every other file's size and sha256, written last (store.py)
    registered        written by the driver once it has the checkpoint's report (store.py)
    hf_model/         a completed run's kept checkpoint only, instead of model.pt and optim.pt:
                      hard links to the exported model's files (store.py, `complete`)

The exported Hugging Face model (data/model) is made from model.pt (train/outputs/export.py).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch

from wellfed.disk import write_failure, writing
from wellfed.outputs import shown
from wellfed.train.checkpoints.state import TrainState

MODEL = "model.pt"
OPTIM = "optim.pt"
STATE = "train_state.json"
VAL_LOGITS = "val_logits.npy"
PROFILE = "profile"
MANIFEST = "manifest.json"
REGISTERED = "registered"
HF_MODEL = "hf_model"
RERUN = ("rerun `dvc repro`: it checks the checkpoints (against their manifests, and that torch "
         "loads them) and resumes from the newest good one (delete this one first if it passes)")
RESUME = "then rerun `dvc repro` to resume from the last checkpoint"
EXPORT = "then rerun `dvc repro`: training is done, the rerun only exports"


class Damaged(Exception):
    """A checkpoint that cannot be read: str() names its folder and what failed, in one line."""


def unwrap(model):
    return getattr(model, "module", model)


def save(directory: Path, s, state: TrainState, final: bool, profile_dir: Path | None,
         val_logits: np.ndarray | None = None, random_states: list[dict] | None = None) -> None:
    """Write the checkpoint of Setup `s` (its model, optimizer, scheduler, scaler), every
    rank's `random_states` (random_state.gather) and `state`; a `final` one without the
    optimizer's state (2x the weights with Adam) and random states, which nothing would read:
    a resume from it trains no further step, and a completed run drops it.
    A folder that is full or read-only raises its one line (outputs.WriteFault), not torch's
    `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos`."""
    try:
        with writing(directory / MODEL) as f:
            torch.save(unwrap(s.model).state_dict(), f)
        if not final:
            with writing(directory / OPTIM) as f:
                torch.save({"optimizer": s.optimizer.state_dict(),
                            "scheduler": s.scheduler.state_dict(),
                            "scaler": s.scaler.state_dict(), "rng": random_states}, f)
        (directory / STATE).write_text(json.dumps(state.to_json()))
        if val_logits is not None:
            with writing(directory / VAL_LOGITS) as f:
                np.save(f, val_logits)
        if final and profile_dir and any(profile_dir.iterdir()):
            shutil.copytree(profile_dir, directory / PROFILE)
    except Exception as err:  # the store's scratch: its launch folder is where the room is
        if (failure := write_failure(directory.parent, err, RESUME)) is err:
            raise
        raise failure from None


def save_hf(model, directory: Path) -> None:
    """`model` (unwrapped) as a Hugging Face model directory. LoRA: the adapters are folded into
    the base weights (W + alpha/r x BA), so the export is a plain transformers model that loads
    without peft; in place, without a copy (a 7B model would need another 14 GB), so `model` is
    merged afterwards."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    try:
        model.save_pretrained(directory, safe_serialization=True)
    except Exception as err:  # safetensors: `I/O error: No space left on device (os error 28)`
        if (failure := write_failure(directory.parent, err, EXPORT)) is err:
            raise
        raise failure from None


def weights(directory: Path) -> dict:
    """The state dict in `directory`'s model.pt; Damaged in one line when torch cannot load it."""
    return read(directory, MODEL)


def read(directory: Path, name: str):
    """`directory`/`name` loaded by torch, weights_only (a checkpoint never gets to run code on
    load); any failure to load it (truncated, not a torch file, a pickle weights_only refuses:
    planted, or written by a torch that pickles what this one does not allow) is Damaged, in
    one line naming the checkpoint and what torch said."""
    try:
        return torch.load(directory / name, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as err:
        raise Damaged(f"checkpoint {shown(directory.absolute())}: {name} cannot be read "
                      f"({one_line(err)}); {RERUN}") from None


def unloadable(directory: Path) -> str | None:
    """What stops torch loading `directory`'s model.pt or optim.pt, in a few words (None: both
    load). A checkpoint can match its manifest and still fail there: a pickle weights_only
    refuses (a file planted with its manifest, one from a torch that pickles other types).
    Memory-mapped, the tensors' bytes are not read: the pickles alone, milliseconds at any size
    (the manifest's sha256 has just read every byte)."""
    for name in (MODEL, OPTIM):
        path = directory / name
        if not path.is_file():
            continue
        if not zipfile.is_zipfile(path):  # torch.save's format since torch 1.6; mmap needs it
            return f"{name} is not a torch checkpoint (not a zip archive)"
        try:
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except MemoryError:
            raise
        except Exception as err:
            return f"{name} cannot be loaded ({one_line(err)})"
    return None


def load(directory: Path, s, metric: str, finished=lambda state: False
         ) -> tuple[TrainState, list[dict] | None]:
    """Restore Setup `s` from a checkpoint; return its training state (a checkpoint from before
    best tracking gets a fresh record for `metric`) and every rank's random states (None: a
    final checkpoint, or one from before they were kept). A final checkpoint has no optimizer
    state: `finished(state)` says the run trains no further step from it."""
    unwrap(s.model).load_state_dict(weights(directory))
    if not (directory / OPTIM).exists() and finished(read_state(directory, metric)):
        return read_state(directory, metric), None
    optim = read(directory, OPTIM)
    s.optimizer.load_state_dict(optim["optimizer"])
    s.scheduler.load_state_dict(optim["scheduler"])
    s.scaler.load_state_dict(optim["scaler"])
    return read_state(directory, metric), optim.get("rng")


def read_state(directory: Path, metric: str | None = None) -> TrainState:
    return TrainState.from_json(json.loads((directory / STATE).read_text()), metric)


def one_line(err: BaseException) -> str:
    """torch's reading errors run to 5 sentences of advice; one says what failed: the global a
    weights_only load refused (`Trying to load unsupported GLOBAL posix.system whose module
    posix is blocked`), else the first sentence of the last line but the link to the docs."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for line in lines:
        if "GLOBAL " in line:
            return line.removeprefix("WeightsUnpickler error: ").split(". ")[0].rstrip(".")
    lines = [line for line in lines if not line.startswith("Check the documentation")]
    return lines[-1].split(". ")[0].rstrip(".") if lines else type(err).__name__
