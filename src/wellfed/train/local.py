"""One worker on this machine: the loop runs in the train stage's own process, without Ray Train.

Ray Train's controller, placement group and worker actors cost ~21 s of every run here (the
train stage's time breakdown, benchmarks/results/train_stage.json), and for one local worker
they buy nothing the loop needs: there is no collective, no other node, and `loop.train` runs
anywhere. So with one worker and no cluster to join (`ray.in_process: auto`) the driver runs the
loop itself, and does what Ray Train did around it with the same parts:
- checkpoints: Ray's own StorageContext and CheckpointManager, under the driver's
  CheckpointConfig. The run folder gets Ray's layout and snapshot, so a run stopped here resumes
  under Ray Train (on 2 workers, say) and the other way round, and the best and latest
  checkpoints are kept as Ray keeps them. Both classes are Ray internals
  (`ray.train.v2._internal`): pyproject.toml pins ray to 2.60.x, and tests/train/test_selection.py
  and the preemption tests pin the behaviour;
- reports: the same MlflowCallback, called as Ray's controller calls it (`after_report`);
- preemption: the same `run_stoppable`; the stop check is a threading.Event;
- a failure: the same one line as from a Ray worker, the traceback in the run folder; there is
  no restart (`ray.max_failures`): a rerun resumes from the last checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import traceback
from pathlib import Path
from types import SimpleNamespace

from wellfed import device as dev
from wellfed.train import runs
from wellfed.train.loop import Place, TrainJob, train


class Store:
    """The run's checkpoints as Ray Train keeps them: copied into `<storage>/<name>/checkpoint_*`,
    registered (and pruned) by Ray's checkpoint manager, which also reloads the snapshot an
    interrupted run left, in-process or under Ray."""

    def __init__(self, storage_uri: str, name: str, config):
        from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import \
            CheckpointManager
        from ray.train.v2._internal.execution.context import StorageContext

        # Ray logs every persisted checkpoint and snapshot lookup at INFO: the console is for
        # the stage's own lines, as with Ray Train (its LoggingConfig, driver.run_trainer).
        logging.getLogger("ray.train").setLevel(logging.WARNING)
        self.storage = StorageContext(storage_uri, name)
        self.manager = CheckpointManager(config, self.storage)

    def latest(self):
        """The checkpoint a resume starts from (a ray.train.Checkpoint), or None."""
        latest = self.manager.latest_checkpoint_result
        return latest.checkpoint if latest else None

    def persist(self, metrics: dict, directory: Path):
        """Copy a checkpoint the loop wrote into the run folder and register it; return it."""
        from ray.train import Checkpoint
        from ray.train.v2._internal.execution.training_report import _TrainingReport

        kept = self.storage.persist_current_checkpoint(
            Checkpoint.from_directory(str(directory)),
            self.storage.make_default_checkpoint_dir_name())
        self.manager.register_checkpoint(_TrainingReport(kept, metrics, False))
        return kept

    def result(self) -> SimpleNamespace:
        """What Ray's `trainer.fit()` returns, as far as the driver reads it."""
        return SimpleNamespace(checkpoint=self.latest(),
                               best_checkpoints=[(r.checkpoint, r.metrics)
                                                 for r in self.manager.best_checkpoint_results])


def fit(job: TrainJob, store: Store, callback, *, use_gpu: bool, threads: int,
        stop: threading.Event) -> SimpleNamespace:
    """Train `job` here, on cuda:0 or the CPU with `threads` torch threads; every report goes to
    `callback` (an MlflowCallback) and every checkpoint into `store`. Returns `store.result()`.
    Runs in the thread `run_stoppable` starts, so torch's thread count is set here."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the callback's progress line is the progress shown
    torch.set_num_threads(threads)
    device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")
    if use_gpu:
        dev.use_device(device)
    place = Place(device, 0, 1, os.uname().nodename)

    def report(metrics: dict, directory: Path | None) -> None:
        kept = store.persist(metrics, directory) if directory else None
        callback.after_report(None, [metrics], kept)

    async def run() -> None:  # Ray's checkpoint manager notifies its listeners in an event loop
        resume = store.latest()
        if resume is None:
            train(job, place, report, stop=stop.is_set)
            return
        with resume.as_directory() as saved:
            train(job, place, report, resume=Path(saved), stop=stop.is_set)

    asyncio.run(run())
    return store.result()


def keep_traceback(err: BaseException, run_dir: Path) -> Path | None:
    """Write `err`'s traceback into the run folder (a local one); return where, or None."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / runs.TRACEBACK
        path.write_text("".join(traceback.format_exception(err)), encoding="utf-8")
        return path
    except OSError:
        return None
