"""A search survives what a run survives: its disk checked before any trial, a full disk
mid-search said in the stages' line with its state whole and its runs ended, a search killed
outright leaving no child RUNNING after its rerun, a trial of a phase started afresh handed back
from the ledger, and a lost trial said in one line of ours."""

from __future__ import annotations

import collections
import errno
import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import random_token_files
from tests.e2e.pipeline import PROJECT
from wellfed.outputs import WriteFault
from wellfed.search import endings, lock, story
from wellfed.search.rungs import Rungs
from wellfed.search.trial import config_key

SEARCH = {"trials": 2, "min_steps": 2, "max_steps": 8, "reduction_factor": 2, "finalists": 1,
          "seeds": [1], "concurrent": 1, "space": {"train": {"lr": "log_uniform 1e-4 1e-2"}}}
METRIC = "val/macro_f1"


@pytest.fixture
def project(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((PROJECT / "params.yaml").read_text())
    params["search"].update(SEARCH)
    params["model"].update({"name": str(tiny_model_dir), "init": "random"})
    params["train"].update({"epochs": 1, "global_batch_size": 16, "micro_batch_size": 16})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "data" / "tokens").mkdir(parents=True)
    random_token_files(tmp_path / "data" / "tokens", tiny_model_dir)
    return tmp_path


def test_free_space_is_checked_before_any_trial_or_run(project, tiny_model_dir, monkeypatch):
    from wellfed.config import load_params
    from wellfed.search import driver

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr("wellfed.outputs.shutil.disk_usage", lambda _: usage(10**9, 0, 10**6))
    monkeypatch.setattr(story, "parent_run", lambda *a: pytest.fail("a run opened first"))
    configs = load_params("params.yaml", "search", "train", "model", "data", "ray", "mlflow")
    meta = {"task": "single_label", "labels": ["0", "1"], "pad_id": 0,
            "model_source": str(tiny_model_dir), "split_fingerprints": {}}
    with lock.held(Path("data/search")), pytest.raises(WriteFault) as full:
        driver.run(*configs, Path("data/tokens"), meta, Path("data/search"), project)
    line = str(full.value)
    assert line.startswith("cannot write data/search/s-") and "it has 1 MB free, and this " \
        "stage will write about " in line and "([Errno 28] No space left on device)" in line
    assert line.endswith("then rerun `wellfed-search` to resume it")


def test_the_room_fused_trials_keep_at_a_rung_is_checked_too(tmp_path, monkeypatch):
    """Fused trials keep each trial's weights and AdamW's moments at a rung (trials/resume.py):
    3 x the model a trial. Before, the check asked 2 MB a trial whatever the model, so a disk
    with room for that passed and filled mid-search (MiniLM: 270 MB a trial)."""
    from wellfed.search import room

    model = tmp_path / "model"
    model.mkdir()
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(10_000_000)  # a 10 MB model: 30 MB a fused trial
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr("wellfed.outputs.shutil.disk_usage", lambda _: usage(10**9, 0, 4 * 10**8))
    assert room.state_bytes(True, 16, str(model)) == 16 * 30_000_000
    assert room.state_bytes(False, 16, str(model)) == 0  # ASHA's trials keep no state
    room.check(tmp_path / "search", 16, None, False, room.state_bytes(False, 16, str(model)))
    with pytest.raises(WriteFault) as full:
        room.check(tmp_path / "search", 16, None, False, room.state_bytes(True, 16, str(model)))
    assert "it has 400 MB free, and this stage will write about 512 MB" in str(full.value)
    # a resumed search: what its groups/ holds already is not asked for again
    held = tmp_path / "search" / "groups"
    held.mkdir(parents=True)
    with open(held / "t1@4.pt", "wb") as f:
        f.truncate(200_000_000)
    assert room.state_bytes(True, 16, str(model), held) == 16 * 30_000_000 - 200_000_000
    room.check(tmp_path / "search", 16, None, False, room.state_bytes(True, 16, str(model), held))


@pytest.fixture
def search(project):
    """A search's parent run and its story of the search phase, in a sqlite store here."""
    uri = f"sqlite:///{project / 'mlflow.db'}"
    folder = Path("data/search/s-0123456789")  # as the command names it, in the project
    folder.mkdir(parents=True)
    parent = story.parent_run(uri, "wellfed", "s-0123456789", {"search.trials": 2})
    (folder / "search.json").write_text(json.dumps({"mlflow_parent": parent,
                                                    "tracking_uri": uri}))
    teller = story.Story(uri, parent, "s-0123456789", "search", folder, METRIC,
                         Rungs([2, 4], 2, False), 8, 2)
    return uri, parent, folder, teller


def report(step: int, value: float) -> dict:
    return {"step": step, METRIC: value, "records": [[step, 0.5, 1e-3]]}


def statuses(uri: str) -> dict[str, str]:
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("wellfed").experiment_id])
    return {r.data.tags.get(story.TRIAL_TAG, "parent"): r.info.status for r in runs}


def test_a_full_disk_mid_search_keeps_the_state_whole_says_the_line_and_ends_the_runs(
        search, monkeypatch):
    uri, parent, folder, teller = search
    teller.start("a", {"train.lr": 0.001})
    teller.result("a", report(8, 0.7))
    teller.complete("a")  # its ledger entry: the state a rerun resumes from
    before = (folder / "finished" / "a.json").read_bytes()
    teller.start("b", {"train.lr": 0.002})
    teller.result("b", report(8, 0.6))

    real = Path.write_text

    def half_then_full(self, text, *args, **kwargs):  # the disk fills half-way through
        real(self, text[:len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full)
    root = folder.parent
    with lock.held(root):
        lock.name(root, "s-0123456789")
        with pytest.raises(WriteFault) as full:
            endings.ended(lambda: teller.complete("b"), root)
    monkeypatch.setattr(Path, "write_text", real)
    assert str(full.value).startswith("cannot write data/search/s-0123456789/finished: it is "
                                      "full ([Errno 28] No space left on device); free some ")
    assert str(full.value).endswith("then rerun `wellfed-search` to resume it")
    assert sorted(p.name for p in (folder / "finished").iterdir()) == ["a.json"]  # no tmp left
    assert (folder / "finished" / "a.json").read_bytes() == before
    assert statuses(uri) == {"parent": "FAILED", "a": "FINISHED", "b": "FAILED"}


def test_a_rerun_ends_the_children_a_search_killed_outright_left_running(search):
    uri, parent, folder, teller = search
    teller.start("a", {"train.lr": 0.001})  # then SIGKILL: nothing ran on the way out
    assert statuses(uri) == {"parent": "RUNNING", "a": "RUNNING"}
    assert endings.stale(uri, parent, "s-0123456789") == 1
    assert statuses(uri) == {"parent": "RUNNING", "a": "KILLED"}


def test_a_phase_started_afresh_hands_back_its_finished_trials_into_their_child(search):
    uri, parent, folder, teller = search
    config = {"train.lr": 0.001}
    teller.start("a", config)
    teller.result("a", report(8, 0.7))
    teller.complete("a")
    # the phase started again under new trial ids (its Tune state set aside, or the final
    # check's grid): the same config is handed back, into the same child run
    recorded = story.finished(folder)
    assert recorded[config_key(config)] == recorded["a"]
    again = story.Story(uri, parent, "s-0123456789", "search", folder, METRIC,
                        Rungs([2, 4], 2, False), 8, 2)
    again.start("new", dict(config))
    assert "new" in again.replayed and again.runs["new"] == teller.runs["a"]
    again.result("new", report(8, 0.7))
    again.complete("new")
    assert sorted(p.stem for p in (folder / "finished").iterdir()) == ["a"]
    assert statuses(uri) == {"parent": "RUNNING", "a": "FINISHED"}


def test_a_trial_cut_off_and_started_afresh_goes_on_in_its_child(search):
    uri, parent, folder, teller = search
    teller.start("a", {"train.lr": 0.001})
    teller.interrupted()
    again = story.Story(uri, parent, "s-0123456789", "search", folder, METRIC,
                        Rungs([2, 4], 2, False), 8, 2)
    again.start("new", {"train.lr": 0.001})
    assert again.runs["new"] == teller.runs["a"] and "new" not in again.replayed
    assert statuses(uri) == {"parent": "RUNNING", "new": "RUNNING"}


LOST = """Failure # 1 (occurred at 2026-11-28_17-10-00)
The actor died unexpectedly before finishing this task.
\tclass_name: ImplicitFunc
\tactor_id: 5b1f
\tpid: 4242
The actor is dead because its worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT
"""


def test_a_lost_worker_and_a_failed_trial_are_said_in_a_line(tmp_path):
    from wellfed.search.tune_callback import reason

    class Trial:
        error_file = str(tmp_path / "error.txt")

    Path(Trial.error_file).write_text(LOST)
    assert reason(Trial()) == "its Ray worker died mid-trial (killed, or out of memory)"
    Path(Trial.error_file).write_text("Traceback (most recent call last):\n  File \"x.py\"\n"
                                      "ray.exceptions.RayTaskError(ValueError): bad lr\n"
                                      "ValueError: train.lr must be positive\n")
    assert reason(Trial()) == "ValueError: train.lr must be positive"


SYNC_FAILED = """Last sync command failed with the following error:
Traceback (most recent call last):
  File "ray/train/_internal/syncer.py", line 341, in _launch_sync_process
    self.wait()
OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device
"""


def test_a_full_disk_under_rays_syncer_is_the_searchs_line_not_a_traceback_a_turn(
        tmp_path, caplog):
    import logging

    from wellfed.search import room

    room.watch_sync()
    logger = logging.getLogger(room.SYNC_LOGGER)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # one per turn of Tune's loop
            logger.warning(SYNC_FAILED)
        logger.warning("Last sync command failed with the following error:\nTimeoutError()")
    assert [r.getMessage() for r in caplog.records] == [
        "Last sync command failed with the following error:\nTimeoutError()"]
    with pytest.raises(WriteFault) as full:
        room.SYNC.raise_found(Path("data/search/s-0123456789"))
    assert str(full.value).startswith("cannot write data/search/s-0123456789: it is full "
                                      "([Errno 28] No space left on device); free some space")
    room.SYNC.raise_found(Path("data/search/s-0123456789"))  # said once
