"""The train stage's checks before anything trains (train/run/preflight.py, driver.fit): a folder
the run would write into that refuses files, or lacks room for what the run will put there,
stops it with the folder's one line before an MLflow run opens or a step runs; a validation
split that cannot pick a checkpoint is said before training; and an MLflow run that no run
file names is not left behind."""

from __future__ import annotations

import errno
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import random_token_files
from wellfed.config import DataConfig, ModelConfig, RayConfig, TrainConfig
from wellfed.data.token_files import TokenBatch, TokenFile, write_token_file
from wellfed.outputs import WriteFault
from wellfed.train.run import driver, mlflow_run, runs
from wellfed.train.step.loop import TrainJob


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_model_dir) -> TrainJob:
    tokens = random_token_files(tmp_path_factory.mktemp("tokens"), tiny_model_dir)
    cfg = TrainConfig(epochs=1, global_batch_size=16, micro_batch_size=8, eval_every=0,
                      report_every=4, checkpoint_every=4, precision="fp32")
    return TrainJob(train=cfg, data=DataConfig(), model=ModelConfig(init="random"),
                    tokens_dir=tokens, model_source=str(tiny_model_dir), labels=("neg", "pos"),
                    pad_id=0)


def fit(job: TrainJob, root: Path, outputs=None, tokens: Path | None = None):
    return driver.fit(tokens_dir=tokens or job.tokens_dir, model_source=job.model_source,
                      labels=list(job.labels), pad_id=0, task="single_label", model_cfg=job.model,
                      train_cfg=job.train, data_cfg=job.data, ray_cfg=RayConfig(cpus_per_worker=1),
                      storage=root / "ckpt", uri=f"sqlite:///{root / 'mlflow.db'}",
                      experiment="x", params={}, tags={}, outputs=outputs)


def refusing(monkeypatch, folder: Path) -> None:
    """Files cannot be made in `folder`, as on a read-only mount (errno 30)."""
    original = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == folder:
            raise OSError(errno.EROFS, "Read-only file system", str(dir))
        return original(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def nothing_started(root: Path) -> None:
    """No MLflow store, run or checkpoint launch: the check came before all of them."""
    assert not (root / "mlflow.db").exists()
    assert not list((root / "ckpt").glob("wf-*/*-in_process"))


def test_an_unwritable_data_folder_stops_the_run_before_it_trains(job, tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    refusing(monkeypatch, data)
    with pytest.raises(WriteFault) as err:
        fit(job, tmp_path, outputs=(data / "model", data / "train"))
    assert str(err.value) == (f"cannot write {data}: it is on a read-only file system ([Errno "
                              "30] Read-only file system); make it writable, then rerun `dvc "
                              "repro`")
    nothing_started(tmp_path)


def test_checkpoint_storage_without_room_for_the_checkpoints_to_come_stops_it(job, tmp_path,
                                                                               monkeypatch):
    """16 steps, a checkpoint every 4, all kept: 4 checkpoints of 3x the weights (weights and
    AdamW's two moments), and on the same filesystem the exported model, the reports and the
    MLflow store's copy: more than 1 MB free can take."""
    from wellfed.model import weight_bytes

    real = shutil.disk_usage

    def usage(path):
        found = real(path)
        return found._replace(free=1_000_000) if Path(path) == tmp_path / "ckpt" else found

    (tmp_path / "ckpt").mkdir()
    monkeypatch.setattr(shutil, "disk_usage", usage)
    with pytest.raises(WriteFault) as err:
        fit(job, tmp_path, outputs=(tmp_path / "data" / "model", tmp_path / "data" / "train"))
    need = (4 * 3 + 1 + 1) * weight_bytes(job.model_source) + 2_000_000
    assert weight_bytes(job.model_source) > 1_000_000  # the tiny BERT: ~4 MB from its config
    assert str(err.value) == (f"cannot write {tmp_path / 'ckpt'}: it has 1 MB free, and this "
                              f"stage will write about {need / 1e6:,.0f} MB on its filesystem "
                              "([Errno 28] No space left on device); free some space (what each "
                              "run keeps and how to remove it: README, \"Faults and resume\"), "
                              "then rerun `dvc repro`")
    nothing_started(tmp_path)


def test_a_one_class_validation_split_is_said_before_training(job, tmp_path, monkeypatch,
                                                              capsys):
    tokens = tmp_path / "tokens"
    shutil.copytree(job.tokens_dir, tokens)
    val = TokenFile(job.tokens_dir / "validation.arrow")
    rows = [val.row(i) for i in range(len(val))]
    (tokens / "validation.arrow").unlink()
    write_token_file(tokens / "validation.arrow", [TokenBatch(
        np.concatenate(rows), np.array([len(r) for r in rows], np.int32),
        np.ones(len(rows), np.int64), np.arange(len(rows)))])
    refusing(monkeypatch, tmp_path / "data")  # stops it right after the checks
    (tmp_path / "data").mkdir()
    with pytest.raises(WriteFault):
        fit(job, tmp_path, outputs=(tmp_path / "data" / "model", tmp_path / "data" / "train"),
            tokens=tokens)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "WARNING" in x]
    assert line.startswith(f"[wellfed] WARNING: validation split ({tokens / 'validation.arrow'})"
                           " has one class (pos: 32 rows): checkpoint selection on it is blind "
                           "and calibration is not applied; give prepare.validation a file")


def test_a_new_mlflow_run_no_run_file_can_name_is_deleted(job, tmp_path, monkeypatch):
    """The run file is how a rerun finds its MLflow run: one that could not be written leaves
    no empty FAILED run behind (the rerun opens its own)."""
    import mlflow

    def refused(*args, **kwargs):
        raise WriteFault(errno.EROFS, "cannot write ckpt: it is on a read-only file system")

    monkeypatch.setattr(runs, "write_run_file", refused)
    run = runs.plan(job.tokens_dir, job.train, job.model, str(tmp_path / "ckpt"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(WriteFault):
        mlflow_run.open_run(run, uri, "x", {}, {}, {"derived.world_size": 1}, tmp_path / "ckpt",
                            None)
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("x").experiment_id
    assert client.search_runs([experiment]) == []
    (deleted,) = client.search_runs([experiment], run_view_type=mlflow.entities.ViewType.ALL)
    assert deleted.info.lifecycle_stage == "deleted"


def test_a_run_completed_after_its_dvc_had_gone_is_handed_back_not_trained_again(
        job, tmp_path, monkeypatch):
    """train/run/orphan.py: a completion whose dvc had gone (watchdog.orphaned) keeps a copy of its
    outputs and a digest of its inputs; a rerun with the same inputs, whose outputs dvc removed
    first, gets them back and `Recorded` (the stage says so and exits 0: dvc records them).
    Changed params, a completion dvc saw, or no whole copy: the run is cleared and trains."""
    from wellfed import watchdog
    from wellfed.train.run import orphan

    storage, params = str(tmp_path / "ckpt"), {"train.lr": 1e-4, "ray.num_workers": 1}
    model, reports = tmp_path / "data" / "model", tmp_path / "data" / "train"
    outputs = [model, reports]

    def complete(orphaned: bool) -> runs.Run:
        for folder, text in ((model, "weights"), (reports / "history", "steps")):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "out.txt").write_text(text)
        run = runs.plan(job.tokens_dir, job.train, job.model, storage, params, outputs)
        monkeypatch.setattr(watchdog, "orphaned", lambda: orphaned)
        runs.write_run_file(storage, run.name, "abc123", complete=False)
        runs.mark_complete({**run.info(), "outputs": [str(p) for p in outputs]}, "abc123",
                           {"registered_model": "wellfed-classifier", "model_version": "3"})
        shutil.rmtree(model)  # what dvc does to a stage's outputs before it runs it
        (reports / "history" / "out.txt").unlink()
        return run

    def trains(with_params: dict) -> bool:
        run = runs.plan(job.tokens_dir, job.train, job.model, storage, with_params, outputs)
        return run.resume_id is None and not (tmp_path / "ckpt" / run.name).exists()

    run = complete(orphaned=True)
    (reports / ".gitignore").write_text("/history\n")  # dvc's, beside the outputs
    with pytest.raises(orphan.Recorded) as done:
        runs.plan(job.tokens_dir, job.train, job.model, storage, params, outputs)
    assert str(done.value) == (
        f"run {run.name} already completed with these inputs (MLflow run abc123, "
        "models:/wellfed-classifier/3) after the dvc running it had gone: its outputs are back "
        f"in place, nothing to train, dvc records them now (delete {storage}/{run.name} to "
        "train it again)")
    assert (model / "out.txt").read_text() == "weights"
    assert (reports / "history" / "out.txt").read_text() == "steps"
    assert (reports / ".gitignore").is_file()
    assert trains({**params, "ray.num_workers": 2})  # another input: cleared, trains afresh
    complete(orphaned=False)  # dvc saw it complete: a rerun is a forced one, which trains
    assert trains(params)
    run = complete(orphaned=True)
    shutil.rmtree(tmp_path / "ckpt" / run.name / orphan.KEPT)
    assert trains(params)  # nothing whole to hand back
