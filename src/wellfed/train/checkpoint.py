"""The checkpoint layout, named once: what one training checkpoint directory holds.

    model.pt          the model's state dict (unwrapped from DDP)
    optim.pt          optimizer, LR scheduler and GradScaler state
    train_state.json  step, epoch and sampler position, the per-step history so far and the
                      best validation so far (train/selection.py)
    hf_model/         the final checkpoint only (the last step, or an early stop): a Hugging
                      Face model directory (safetensors), LoRA adapters merged into the weights;
                      other checkpoints are exported from model.pt (train/driver.py)
    profile/          the final checkpoint only, when train.profile_steps is set: the trace
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

MODEL = "model.pt"
OPTIM = "optim.pt"
STATE = "train_state.json"
HF_MODEL = "hf_model"
PROFILE = "profile"


def unwrap(model):
    return getattr(model, "module", model)


def save(directory: Path, s, state: dict, final: bool, profile_dir: Path | None) -> None:
    """Write the checkpoint of Setup `s` (its model, optimizer, scheduler, scaler) and `state`."""
    torch.save(unwrap(s.model).state_dict(), directory / MODEL)
    torch.save({"optimizer": s.optimizer.state_dict(), "scheduler": s.scheduler.state_dict(),
                "scaler": s.scaler.state_dict()}, directory / OPTIM)
    (directory / STATE).write_text(json.dumps(state))
    if final:
        # In place (see save_hf): this is the run's last step, model.pt above keeps the adapters
        # for a resume.
        save_hf(unwrap(s.model), directory / HF_MODEL)
        if profile_dir and any(profile_dir.iterdir()):
            shutil.copytree(profile_dir, directory / PROFILE)


def save_hf(model, directory: Path) -> None:
    """`model` (unwrapped) as a Hugging Face model directory. LoRA: the adapters are folded into
    the base weights (W + alpha/r x BA), so the export is a plain transformers model that loads
    without peft; in place, without a copy (a 7B model would need another 14 GB), so `model` is
    merged afterwards."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model.save_pretrained(directory, safe_serialization=True)


def load(directory: Path, s) -> dict:
    """Restore Setup `s` from a checkpoint; return its training state."""
    # weights_only=True: a checkpoint never gets to run code on load.
    unwrap(s.model).load_state_dict(torch.load(directory / MODEL, map_location="cpu",
                                               weights_only=True))
    optim = torch.load(directory / OPTIM, map_location="cpu", weights_only=True)
    s.optimizer.load_state_dict(optim["optimizer"])
    s.scheduler.load_state_dict(optim["scheduler"])
    s.scaler.load_state_dict(optim["scaler"])
    return read_state(directory)


def read_state(directory: Path) -> dict:
    return json.loads((directory / STATE).read_text())
