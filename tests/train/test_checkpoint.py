"""The checkpoint files (train/checkpoints/checkpoint.py) when writing or loading them fails: a full
or read-only folder says so in the folder's one line, whatever library wrote the file (torch used to
raise `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos`), and a file torch
will not load is a damaged checkpoint named in one line."""

from __future__ import annotations

import errno
import io
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.train.test_store import Planted, fake_checkpoint
from wellfed import disk
from wellfed.outputs import WriteFault
from wellfed.train.checkpoints import checkpoint
from wellfed.train.checkpoints.state import Best, TrainState

FULL = ("it is full ([Errno 28] No space left on device); free some space (what each run keeps "
        "and how to remove it: README, \"Faults and resume\")")


AT_STEP_3 = TrainState(Best("val/loss"), step=3)


def setup(width: int = 256) -> SimpleNamespace:
    """What checkpoint.save takes from train/step/setup.py's Setup: a model with its optimizer,
    schedule and scaler (AdamW, after one step: its state is twice the weights)."""
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, width)).sum().backward()
    optimizer.step()
    return SimpleNamespace(model=model, optimizer=optimizer,
                           scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                           scaler=torch.amp.GradScaler("cpu", enabled=False))


class FullAfter(io.RawIOBase):
    """A file on a disk that fills after `room` bytes."""

    def __init__(self, path, room: int):
        self.f, self.room = open(path, "wb", buffering=0), room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def close(self) -> None:
        self.f.close()
        super().close()


def scratch(root: Path) -> Path:
    """The store's scratch folder inside a launch, as Store.scratch makes it."""
    path = root / "ckpt" / "wf-run" / "01-in_process" / ".scratch.tmp-0123abcd"
    path.mkdir(parents=True)
    return path


def test_a_disk_that_fills_while_a_checkpoint_is_written_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(disk, "open", lambda path, mode: io.BufferedWriter(FullAfter(path, 4096)),
                        raising=False)
    with pytest.raises(WriteFault) as err:
        checkpoint.save(scratch(tmp_path), setup(), AT_STEP_3, False, None)
    assert str(err.value) == (f"cannot write ckpt/wf-run/01-in_process: {FULL}, then rerun "
                              "`dvc repro` to resume from the last checkpoint")


def test_another_write_error_is_left_as_it_is(tmp_path, monkeypatch):
    def broken(path, mode):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    monkeypatch.setattr(disk, "open", broken, raising=False)
    with pytest.raises(OSError) as err:
        checkpoint.save(scratch(tmp_path), setup(), AT_STEP_3, False, None)
    assert err.value.errno == errno.EIO and not isinstance(err.value, WriteFault)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MB tmpfs (root only: skipped elsewhere), unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                            str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield mount
    finally:
        # Lazily: a file torch left open on its error would hold an eager unmount back.
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def test_a_real_full_disk_under_torch_and_safetensors(tiny_disk, tiny_model_dir):
    """torch.save on a filesystem that is really full (the checkpoint: 768 KB of weights and
    1.5 MB of AdamW state in 1 MB), then save_pretrained's safetensors (the export)."""
    from wellfed.config import ModelConfig
    from wellfed.model import load_model

    folder = tiny_disk / "01-in_process" / ".scratch.tmp-0123abcd"
    folder.mkdir(parents=True)
    with pytest.raises(WriteFault) as err:
        checkpoint.save(folder, setup(width=440), AT_STEP_3, False, None)
    assert str(err.value) == (f"cannot write {tiny_disk}/01-in_process: {FULL}, then rerun "
                              "`dvc repro` to resume from the last checkpoint")
    for path in folder.iterdir():
        path.unlink()
    model = load_model(ModelConfig(init="random"), str(tiny_model_dir), ["neg", "pos"], 0)
    with pytest.raises(WriteFault) as err:  # ~4 MB of weights
        checkpoint.save_hf(model, tiny_disk / ".model.tmp-1-0123abcd")
    assert str(err.value) == (f"cannot write {tiny_disk}: {FULL}, then rerun `dvc repro`: "
                              "training is done, the rerun only exports")


def test_loading_a_refused_checkpoint_says_what_torch_refused(tmp_path, monkeypatch):
    """Where the loop loads it (an object store's, which `recover` does not unpickle): Damaged,
    whose line names the checkpoint and the refused global, not torch's closing advice."""
    monkeypatch.chdir(tmp_path)
    folder = fake_checkpoint(tmp_path / "ckpt" / "checkpoint_000010", 10)
    torch.save({"x": Planted(tmp_path / "PLANTED_RAN")}, folder / checkpoint.MODEL)
    with pytest.raises(checkpoint.Damaged) as err:
        checkpoint.weights(folder)
    assert str(err.value).startswith(
        "checkpoint ckpt/checkpoint_000010: model.pt cannot be read (Trying to load unsupported "
        "GLOBAL posix.system whose module posix is blocked); rerun `dvc repro`: it checks")
    assert not (tmp_path / "PLANTED_RAN").exists()
    (folder / checkpoint.MODEL).write_bytes(b"not a torch file")
    assert checkpoint.unloadable(folder) == "model.pt is not a torch checkpoint (not a zip archive)"


