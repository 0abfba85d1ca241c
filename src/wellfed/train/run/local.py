"""One worker on this machine: the loop runs in the train stage's own process, without Ray Train.

Ray Train's controller, placement group and worker actors cost ~21 s of every run here (the
train stage's time breakdown, benchmarks/results/train_stage.json), and for one local worker
they buy nothing the loop needs: there is no collective, no other node, and `loop.train` runs
anywhere. So with one worker and no cluster to join (`ray.in_process: auto`) the driver runs the
loop itself, and does what Ray Train did around it with the same parts:
- checkpoints: wellfed's own store (train/checkpoints/store.py), the one the Ray path writes
  through, so a run stopped here resumes under Ray Train (on 2 workers, say) and the other way
  round;
- reports: the same MlflowCallback, called as Ray's controller calls it (`after_report`);
- preemption: the same `run_stoppable`; the stop check is a threading.Event;
- a failure: the same one line as from a Ray worker, the traceback in the run folder; there is
  no restart (`ray.max_failures`): a rerun resumes from the last good checkpoint.
"""

from __future__ import annotations

import os
import threading
import traceback
from pathlib import Path

from wellfed import device as dev
from wellfed.train.checkpoints import retention
from wellfed.train.checkpoints.store import Entry, Store
from wellfed.train.run import runs
from wellfed.train.step import selection
from wellfed.train.step.loop import Place, TrainJob, train


def fit(job: TrainJob, store: Store, launch: str, callback, *, resume: Entry | None,
        keep: int | None, use_gpu: bool, threads: int, stop: threading.Event) -> None:
    """Train `job` here, on cuda:0 or the CPU with `threads` torch threads, from the checkpoint
    `resume` (None: from step 0); every report goes to `callback` (an MlflowCallback) and every
    checkpoint into `store`'s folder `launch`, pruned to `keep` (train.keep_checkpoints). Runs
    in the thread `run_stoppable` starts, so torch's thread count is set here."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the callback's progress line is the progress shown
    torch.set_num_threads(threads)
    device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")
    if use_gpu:
        dev.use_device(device)
    place = Place(device, 0, 1, os.uname().nodename)

    def report(metrics: dict, directory: Path | None) -> None:
        kept = None
        if directory:
            kept = store.commit(directory, launch, metrics["records"][-1]["step"],
                                metrics.get(selection.RANK_KEY, 0))
        callback.after_report(None, [metrics], kept)
        if kept:  # as on Ray (callback.StoreCallback): registered once its steps are logged
            callback.drain()
            store.register(kept)
            retention.prune(store, keep, best=job.train.select == "best")

    def scratch():  # written where the store keeps it: committed by a rename, not a copy
        return store.scratch(launch)

    try:
        if resume is None:
            train(job, place, report, stop=stop.is_set, scratch=scratch)
            return
        with store.local(resume) as saved:
            train(job, place, report, resume=saved, stop=stop.is_set, scratch=scratch)
    finally:
        callback.close()  # every report sent before the run goes on (or stops)


def keep_traceback(err: BaseException, run_dir: Path) -> Path | None:
    """Write `err`'s traceback into the run folder (a local one); return where, or None."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / runs.TRACEBACK
        path.write_text("".join(traceback.format_exception(err)), encoding="utf-8")
        return path
    except OSError:
        return None
