"""wellfed's checkpoint store (train/checkpoints/store.py) on its properties: written whole or not
at all, checked against its manifest before a resume, damage said in one line, retention,
completion; then the driver resuming across damage, in-process and (marked e2e) on Ray Train."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import random_token_files
from wellfed.config import DataConfig, ModelConfig, RayConfig, TrainConfig
from wellfed.outputs import WriteFault
from wellfed.train.checkpoints import checkpoint, retention
from wellfed.train.run import driver
from wellfed.train.step.loop import TrainJob
from wellfed.disk import link_tree
from wellfed.train.checkpoints.store import Entry, Store


def fake_checkpoint(folder: Path, step: int, size: int = 1000) -> Path:
    """A checkpoint's files, torch files as the loop writes them (`size` random bytes of weights,
    twice as many of optimizer state), without a model to load them into."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"w": torch.frombuffer(bytearray(os.urandom(size)), dtype=torch.uint8)},
               folder / checkpoint.MODEL)
    torch.save({"optimizer": {"m": torch.frombuffer(bytearray(os.urandom(2 * size)),
                                                    dtype=torch.uint8)}},
               folder / checkpoint.OPTIM)
    (folder / checkpoint.STATE).write_text(json.dumps({"step": step}))
    return folder


def committed(store: Store, launch: str, tmp_path: Path, *steps: int, rank: int = 0,
              register: bool = True) -> list[str]:
    """Checkpoints of `steps` written into the store and, as the driver does once it has their
    reports, registered."""
    paths = [store.commit(fake_checkpoint(tmp_path / "src" / str(s), s), launch, s, rank)
             for s in steps]
    for path in paths if register else []:
        store.register(path)
    return paths


def test_a_checkpoint_written_in_the_stores_scratch_is_renamed_not_copied(tmp_path):
    store = Store(str(tmp_path / "ckpt"), "wf-run")
    launch = store.open_launch("in_process")
    with store.scratch(launch) as scratch:
        assert scratch.parent == Path(store.dir, launch)  # on the store's own filesystem
        fake_checkpoint(scratch, 8)
        (scratch / checkpoint.PROFILE).mkdir()
        (scratch / checkpoint.PROFILE / "top_operators.txt").write_text("table")
        inode = (scratch / checkpoint.MODEL).stat().st_ino
        path = store.commit(scratch, launch, 8, 0)
        assert not scratch.exists()
    assert (Path(path) / checkpoint.MODEL).stat().st_ino == inode  # the same file: no copy
    manifest = json.loads(Path(path, checkpoint.MANIFEST).read_text())
    assert sorted(manifest["files"]) == [checkpoint.MODEL, checkpoint.OPTIM,
                                         f"{checkpoint.PROFILE}/top_operators.txt",
                                         checkpoint.STATE]
    store.register(path)
    assert store.problem(store.latest()) is None
    with store.scratch(launch) as scratch:  # a write that failed: its folder goes
        fake_checkpoint(scratch, 9)
    assert sorted(os.listdir(f"{store.dir}/{launch}")) == ["checkpoint_000008", "launch.json"]


def test_a_checkpoint_is_renamed_into_place_with_its_manifest(tmp_path):
    store = Store(str(tmp_path / "ckpt"), "wf-run")
    launch = store.open_launch("in_process")
    (path,) = committed(store, launch, tmp_path, 12)
    assert path == f"{store.dir}/01-in_process/checkpoint_000012"
    assert sorted(os.listdir(f"{store.dir}/{launch}")) == ["checkpoint_000012", "launch.json"]
    manifest = json.loads(Path(path, checkpoint.MANIFEST).read_text())
    assert sorted(manifest["files"]) == [checkpoint.MODEL, checkpoint.OPTIM, checkpoint.STATE]
    assert manifest["files"][checkpoint.MODEL]["size"] == Path(path, checkpoint.MODEL).stat(
        ).st_size > 1000 and manifest["step"] == 12
    assert store.problem(store.latest()) is None
    assert store.open_launch("ray_train") == "02-ray_train"
    traced = fake_checkpoint(tmp_path / "src" / "16", 16)
    (traced / checkpoint.PROFILE).mkdir()  # the final checkpoint's profiler trace: a folder
    (traced / checkpoint.PROFILE / "trace_steps_3-4.json").write_text("{}")
    path = store.commit(traced, launch, 16, 0)
    assert Path(path, checkpoint.PROFILE, "trace_steps_3-4.json").read_text() == "{}"
    assert f"{checkpoint.PROFILE}/trace_steps_3-4.json" in json.loads(
        Path(path, checkpoint.MANIFEST).read_text())["files"]


def test_a_write_that_fails_leaves_nothing_and_names_the_folder(tmp_path, monkeypatch):
    store = Store(str(tmp_path / "ckpt"), "wf-run")
    launch = store.open_launch("in_process")
    copy = store._copy

    def full_after_one(source, dest):
        if source.name == checkpoint.OPTIM:
            raise OSError(errno.ENOSPC, "No space left on device")
        return copy(source, dest)

    monkeypatch.setattr(store, "_copy", full_after_one)
    with pytest.raises(WriteFault) as err:
        committed(store, launch, tmp_path, 8)
    assert str(err.value) == (
        f"cannot write {store.dir}: it is full ([Errno 28] No space left on device); free "
        "some space (what each run keeps and how to remove it: README, \"Faults and resume\"), "
        "then rerun `dvc repro` to resume from the last checkpoint")
    assert os.listdir(f"{store.dir}/{launch}") == ["launch.json"]  # no half checkpoint


def test_a_damaged_newest_checkpoint_is_set_aside_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the project: the line shows the folders inside it as such
    store = Store(str(tmp_path / "ckpt"), "wf-run")
    launch = store.open_launch("in_process")
    oldest, middle, newest = committed(store, launch, tmp_path, 10, 20, 30)
    size = Path(newest, checkpoint.MODEL).stat().st_size
    with open(Path(newest, checkpoint.MODEL), "r+b") as f:  # a crash or a full disk mid-write
        f.truncate(100)
    shutil.rmtree(oldest)  # deleted by hand: nothing may still expect it
    good, line = store.recover()
    assert good.path == middle and good.step == 20
    assert line == (f"[wellfed] damaged checkpoint ckpt/wf-run/{launch}/checkpoint_000030: "
                    f"model.pt has 100 bytes, its manifest says {size:,}; moved aside, resuming "
                    f"from ckpt/wf-run/{launch}/checkpoint_000020 (step 20)")
    assert os.path.isdir(f"{store.dir}/damaged-{launch}-checkpoint_000030")
    assert store.recover() == (good, None)  # said once: the next resume finds it gone


class Planted:
    """A pickle that runs a command when unpickled without weights_only."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plant(entry: str, name: str, payload: object) -> None:
    """Replace `entry`'s file `name` with `payload` saved by torch, and its manifest entry with
    the new file's size and sha256: as someone with write access would, so that the manifest
    check passes."""
    from wellfed.disk import file_sha256

    torch.save(payload, Path(entry, name))
    manifest = json.loads(Path(entry, checkpoint.MANIFEST).read_text())
    manifest["files"][name] = {"size": Path(entry, name).stat().st_size,
                               "sha256": file_sha256(Path(entry, name))}
    Path(entry, checkpoint.MANIFEST).write_text(json.dumps(manifest))


def test_a_checkpoint_torch_refuses_to_load_is_damaged_though_its_manifest_matches(tmp_path):
    """Two real cases: a model.pt planted with its manifest (weights_only refuses its pickle,
    which never runs), and an optim.pt the loop itself committed that this torch will not load
    (a numpy scalar in the optimizer state: what a torch or wellfed of another version could
    pickle). Both are named, moved aside, and the resume goes to the newest good one."""
    import numpy as np

    marker = tmp_path / "PLANTED_RAN"
    store = Store(str(tmp_path / "ckpt"), "wf-run")
    launch = store.open_launch("in_process")
    first, second, third = committed(store, launch, tmp_path, 10, 20, 30)
    plant(third, checkpoint.MODEL, {"w": torch.zeros(3), "x": Planted(marker)})
    assert store.problem(store.entries()[0]) is None
    good, line = store.recover()
    assert good.path == second, line
    assert line == (f"[wellfed] damaged checkpoint {third}: model.pt cannot be loaded (Trying "
                    "to load unsupported GLOBAL posix.system whose module posix is blocked); "
                    f"moved aside, resuming from {second} (step 20)")
    assert not marker.exists()

    src = fake_checkpoint(tmp_path / "src" / "40", 40)
    torch.save({"optimizer": {"step": np.int64(40)}}, src / checkpoint.OPTIM)
    store.register(store.commit(src, launch, 40, 0))
    good, line = store.recover()
    assert good.path == second and line.startswith(
        f"[wellfed] damaged checkpoint {store.dir}/{launch}/checkpoint_000040: optim.pt cannot be "
        "loaded (Unsupported global: GLOBAL numpy.")
    assert [p.name for p in Path(store.dir).glob("damaged-*")] == [  # 30 went: 40 registered
        f"damaged-{launch}-checkpoint_000040"]


def test_a_checkpoint_whose_report_never_reached_the_driver_is_not_resumed_from(tmp_path):
    """Written whole, but the driver was killed before it logged the report that carried it:
    resuming there would leave that report's steps out of MLflow for good."""
    store = Store(str(tmp_path / "ckpt"), "wf-run")
    launch = store.open_launch("ray_train")
    (logged,) = committed(store, launch, tmp_path, 10)
    (lost,) = committed(store, launch, tmp_path, 20, register=False)
    assert store.latest().path == logged
    good, line = store.recover()
    assert (good.path, line) == (logged, None) and not os.path.exists(lost)


def test_when_no_checkpoint_is_good_the_run_starts_fresh_and_says_so(tmp_path):
    store = Store(str(tmp_path / "ckpt"), "wf-run")
    launch = store.open_launch("ray_train")
    first, second = committed(store, launch, tmp_path, 5, 10)
    data = bytearray(Path(second, checkpoint.OPTIM).read_bytes())
    data[7] ^= 0xFF  # same size, other bytes
    Path(second, checkpoint.OPTIM).write_bytes(bytes(data))
    Path(first, checkpoint.MANIFEST).unlink()
    os.makedirs(f"{store.dir}/{launch}/.checkpoint_000015.tmp-0123abcd")  # a killed write
    assert store.recover() == (None, (
        f"[wellfed] damaged checkpoint {second}: optim.pt's sha256 differs from its manifest's "
        "(and 1 older one(s)); moved aside, no good checkpoint is left: starting from step 0"))
    assert store.entries() == [] and os.listdir(f"{store.dir}/{launch}") == ["launch.json"]


def test_retention_while_running_and_once_complete(tmp_path):
    store = Store(str(tmp_path / "ckpt"), "wf-run")
    launch = store.open_launch("in_process")
    committed(store, launch, tmp_path, 4)
    committed(store, launch, tmp_path, 8, rank=2)  # a new best
    committed(store, launch, tmp_path, 12, 16)
    assert retention.prune(store, None, best=True) == 0 and len(store.entries()) == 4  # all: the default
    assert retention.prune(store, 1, best=True) == 2
    assert [e.step for e in store.entries()] == [8, 16]  # the newest and the best
    assert retention.prune(store, 1, best=False) == 1 and [e.step for e in store.entries()] == [16]

    committed(store, launch, tmp_path, 20)
    exported = tmp_path / "mlflow-model"
    exported.mkdir()
    (exported / "model.safetensors").write_bytes(os.urandom(5000))
    (exported / "config.json").write_text("{}")
    chosen = store.entries()[-1]
    assert retention.complete(store, chosen, exported) == 1
    assert [e.step for e in store.entries()] == [20]
    left = sorted(p.relative_to(chosen.path).as_posix() for p in Path(chosen.path).rglob("*"))
    assert left == [checkpoint.HF_MODEL, f"{checkpoint.HF_MODEL}/config.json",
                    f"{checkpoint.HF_MODEL}/model.safetensors", checkpoint.MANIFEST,
                    checkpoint.REGISTERED, checkpoint.STATE]  # no optimizer state, weights once
    linked = Path(chosen.path, checkpoint.HF_MODEL, "model.safetensors")
    assert os.path.samestat(linked.stat(), (exported / "model.safetensors").stat())  # 0 bytes
    assert store.problem(chosen) is None  # its manifest says what is left


def test_without_an_exported_copy_to_link_the_kept_checkpoint_keeps_model_pt(tmp_path):
    store = Store(str(tmp_path / "ckpt"), "wf-run")
    launch = store.open_launch("in_process")
    committed(store, launch, tmp_path, 3, 6)
    chosen = store.entries()[0]
    assert retention.complete(store, chosen, None) == 1
    assert sorted(os.listdir(chosen.path)) == [checkpoint.MANIFEST, checkpoint.MODEL,
                                               checkpoint.REGISTERED, checkpoint.STATE]
    assert store.problem(chosen) is None


def test_link_tree_leaves_nothing_where_it_cannot_link(tmp_path, monkeypatch):
    source = tmp_path / "a"
    source.mkdir()
    (source / "w").write_text("x")
    monkeypatch.setattr(Path, "hardlink_to", lambda self, target: (_ for _ in ()).throw(
        OSError(errno.EXDEV, "Invalid cross-device link")))
    assert not link_tree(source, tmp_path / "b")
    assert sorted(os.listdir(tmp_path)) == ["a"]


def test_seconds_add_up_over_launches_even_one_killed(tmp_path):
    store = Store(str(tmp_path / "ckpt"), "wf-run")
    first = store.open_launch("in_process")
    store.close_launch(first, 30.0)
    second = store.open_launch("ray_train")  # killed: never closed
    record = Path(store.dir, second, "launch.json")
    record.write_text(json.dumps({"engine": "ray_train", "started": 1000.0}))
    (path,) = committed(store, second, tmp_path, 10)
    manifest = json.loads(Path(path, checkpoint.MANIFEST).read_text())
    Path(path, checkpoint.MANIFEST).write_text(json.dumps({**manifest, "written": 1012.5}))
    assert store.seconds_before() == pytest.approx(42.5)


# The driver, resuming across damage: a run of 16 steps, a checkpoint every 4.

@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_model_dir) -> TrainJob:
    tokens = random_token_files(tmp_path_factory.mktemp("tokens"), tiny_model_dir)
    cfg = TrainConfig(epochs=1, lr=3e-3, global_batch_size=16, micro_batch_size=8, eval_every=0,
                      report_every=4, checkpoint_every=4, precision="fp32", seed=0,
                      warmup_ratio=0.0)
    return TrainJob(train=cfg, data=DataConfig(), model=ModelConfig(init="random"),
                    tokens_dir=tokens, model_source=str(tiny_model_dir), labels=("neg", "pos"),
                    pad_id=0)


def fit(job: TrainJob, tmp_path: Path, **ray):
    return driver.fit(tokens_dir=job.tokens_dir, model_source=job.model_source,
                      labels=list(job.labels), pad_id=0, task="single_label", model_cfg=job.model,
                      train_cfg=job.train, data_cfg=job.data,
                      ray_cfg=RayConfig(cpus_per_worker=1, **ray), storage=tmp_path / "ckpt",
                      uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="x", params={},
                      tags={})


def damage(trained, delete: int) -> tuple[str, int, Entry]:
    """Truncate the newest checkpoint's weights and delete the folder of step `delete`; return
    the damaged one, its weights' size, and the checkpoint a resume must start from."""
    found = trained.store.entries()
    size = Path(found[-1].path, checkpoint.MODEL).stat().st_size
    with open(Path(found[-1].path, checkpoint.MODEL), "r+b") as f:
        f.truncate(1000)
    shutil.rmtree(next(e.path for e in found if e.step == delete))
    return found[-1].path, size, [e for e in found[:-1] if e.step != delete][-1]


def steps_in(trained, launch: str) -> list[int]:
    return [e.step for e in trained.store.entries() if e.launch == launch]


def test_a_rerun_in_process_resumes_from_the_checkpoint_before_a_damaged_one(job, tmp_path,
                                                                            capsys):
    trained, run_id, _ = fit(job, tmp_path)
    assert steps_in(trained, "01-in_process") == [4, 8, 12, 16]
    newest, size, before = damage(trained, delete=4)
    capsys.readouterr()
    again, again_id, info = fit(job, tmp_path)  # the run file still says incomplete: a resume
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("[wellfed] damaged")] == [
        f"[wellfed] damaged checkpoint {newest}: model.pt has 1,000 bytes, its manifest says "
        f"{size:,}; moved aside, resuming from {before.path} (step 12)"]
    assert "[wellfed] resuming from step 12 of 16 (epoch 0, batch 12)" in out
    assert again_id == run_id and steps_in(again, "02-in_process") == [16]  # 13-16 only
    assert again.last.step == 16 and info["seconds_before"] > 0  # the first launch's time


def test_a_rerun_past_a_checkpoint_torch_refuses_resumes_from_the_one_before(job, tmp_path,
                                                                           capsys):
    """The newest checkpoint matches its manifest but torch refuses to load it: it used to
    fail every rerun alike (`UnpicklingError: Check the documentation of torch.load...`)."""
    trained, run_id, _ = fit(job, tmp_path)
    found = trained.store.entries()
    assert [e.step for e in found] == [4, 8, 12, 16]
    plant(found[-1].path, checkpoint.MODEL, {"x": Planted(tmp_path / "PLANTED_RAN")})
    capsys.readouterr()
    again, again_id, _ = fit(job, tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("[wellfed] damaged")] == [
        f"[wellfed] damaged checkpoint {found[-1].path}: model.pt cannot be loaded (Trying to "
        "load unsupported GLOBAL posix.system whose module posix is blocked); moved aside, "
        f"resuming from {found[-2].path} (step 12)"]
    assert "[wellfed] resuming from step 12 of 16 (epoch 0, batch 12)" in out
    assert again_id == run_id and steps_in(again, "02-in_process") == [16]
    assert not (tmp_path / "PLANTED_RAN").exists()


def test_a_rerun_with_no_good_checkpoint_starts_from_step_0_and_says_so(job, tmp_path, capsys):
    """The restart's steps are shown like any other, MLflow keeps each step once with the value
    the restart computes again (same seed, batches, per-step RNG), and the damaged checkpoints
    go as soon as the restart's first checkpoint stands in for them."""
    import mlflow

    trained, run_id, _ = fit(job, tmp_path)
    for entry in trained.store.entries():
        Path(entry.path, checkpoint.MANIFEST).write_text("{")  # unreadable
    capsys.readouterr()
    again, again_id, _ = fit(job, tmp_path)
    out = capsys.readouterr().out
    assert ("no good checkpoint is left: starting from step 0" in out
            and ": no good checkpoint was left, starting from step 0" in out)
    assert steps_in(again, "02-in_process") == [4, 8, 12, 16]
    lines = out.splitlines()
    assert "[wellfed] steps up to 16 are redone (a resume or restart from an earlier " \
           "checkpoint): shown, and kept in MLflow as first logged, once each" in lines
    shown = [line.split()[2] for line in lines if line.startswith("[wellfed] step ")]
    assert shown[0] == "4/16" and shown[-1] == "16/16"  # the first report is shown at once
    (removed,) = [line for line in lines if "damaged checkpoint(s)" in line]
    assert removed.endswith("MB): checkpoint_000004 stands in for them")
    assert lines.index(removed) < lines.index(next(x for x in lines if "step 16/16" in x))
    assert not list(Path(again.store.dir).glob("damaged-*"))
    history = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_metric_history(
        again_id, "train/loss")
    assert again_id == run_id and [m.step for m in history] == list(range(1, 17))
    redone = {r["step"]: r["loss"] for r in again.store.state(again.last).history}
    assert [m.value for m in history] == pytest.approx([redone[s] for s in range(1, 17)],
                                                       rel=1e-6)


@pytest.mark.e2e  # starts Ray once: ~1-2 min on 2 busy cores
def test_damage_is_survived_across_engines_in_process_then_ray_then_in_process(job, tmp_path,
                                                                               capsys):
    """A run stopped in-process resumes on Ray Train with 2 workers and the other way round,
    past a damaged newest checkpoint each time; Ray resumes from what the store found good."""
    first, run_id, _ = fit(job, tmp_path)
    newest, _, before = damage(first, delete=12)  # 16 damaged, 12 deleted: resume from 8
    assert before.step == 8
    capsys.readouterr()
    on_ray, ray_id, _ = fit(job, tmp_path, num_workers=2)
    out = capsys.readouterr().out
    assert f"damaged checkpoint {newest}" in out and f"resuming from {before.path} (step 8)" in out
    assert ray_id == run_id and steps_in(on_ray, "02-ray_train") == [12, 16]  # from step 8
    newest, _, before = damage(on_ray, delete=4)  # Ray's 16 damaged: resume from Ray's 12
    assert (before.step, before.launch) == (12, "02-ray_train")
    again, again_id, _ = fit(job, tmp_path)
    assert f"resuming from {before.path} (step 12)" in capsys.readouterr().out
    assert again_id == run_id and steps_in(again, "03-in_process") == [16]
