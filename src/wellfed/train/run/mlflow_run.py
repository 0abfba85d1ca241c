"""The training run's MLflow run: opened, or reopened for a resume (saying from where, and on
how many workers now), with the params and what the driver decided (`derived.*`: the few people
filter by as tags, the rest in the run's details, track/run_details.py); marked FAILED on an
error and KILLED on a stop (resumable, not failed)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from wellfed.config import RayConfig
from wellfed.track import provenance, run_details, tracking
from wellfed.train.checkpoints import preemption
from wellfed.train.run import runs

if TYPE_CHECKING:
    from wellfed.train.checkpoints.store import Entry
    from wellfed.train.step.loop import TrainJob


def open_run(run: runs.Run, uri: str, experiment: str, params: dict, tags: dict,
             derived: dict, storage: Path, resume: Entry | None) -> tuple[str, Path]:
    """Start (or resume) the MLflow run, record it in the run file, log a backlog an interrupted
    run left, log params; return (run id, backlog path)."""
    from wellfed.train.outputs.callback import flush_backlog

    run_id = tracking.start_run(uri, experiment, run.title, run.resume_id, run.tags())
    if run.resume_id == run_id:  # the step it resumes from is rank 0's line, once training starts
        where = "" if resume else ": no good checkpoint was left, starting from step 0"
        print(f"[wellfed] resuming interrupted run {run.name} (MLflow run {run_id}){where}"
              f"{world_size_change(uri, run_id, derived)}", flush=True)
    try:
        with marked_failed(uri, run_id):  # a read-only checkpoint folder, say
            runs.write_run_file(run.storage_uri, run.name, run_id, complete=False)
    except BaseException:
        if run.resume_id != run_id:  # no run file names it, so no rerun could resume it: an
            forget(uri, run_id)      # empty FAILED run would stay beside the rerun's
        raise
    with marked_failed(uri, run_id):
        storage.mkdir(parents=True, exist_ok=True)
        backlog = storage.resolve() / f".{run.name}.mlflow-backlog.jsonl"  # the driver's node
        flush_backlog(uri, run_id, backlog)  # left by an interrupted run: log it before resuming
        tracking.log_params(uri, run_id, params, tags)
        run_details.log_derived(uri, run_id, derived, {
            "versions": provenance.library_versions(), "run_hash": run.run_hash,
            "tokens_sha256": run.data_hash})
    return run_id, backlog


def world_size_change(uri: str, run_id: str, derived: dict) -> str:
    """On a resume: say so when the worker count differs from the one the run last had, and keep
    every count the run has had in the tag `derived.world_sizes` (the tag `derived.world_size`
    becomes the latest)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    run = client.get_run(run_id).data
    world = derived["derived.world_size"]
    # A run made before derived values were tags has its first count as a param.
    sizes = (run.tags.get("derived.world_sizes") or run.tags.get("derived.world_size")
             or run.params.get("derived.world_size", ""))
    before = sizes.split(",")[-1] if sizes else ""
    if not before or before == str(world):
        return ""
    client.set_tag(run_id, "derived.world_sizes", f"{sizes},{world}")
    return (f", now on {world} worker(s) instead of {before}: the same global batch, "
            f"{derived['derived.accumulation_steps']} micro-batch(es) per worker per step")


def derived_tags(job: TrainJob, run: runs.Run, ray_cfg: RayConfig, use_gpu: bool,
                 engine: str) -> dict:
    """What the driver decided, as `derived.*` values (no one set them: they are not params;
    run_details.log_derived says which are tags); the console says each choice as it is made.
    The run's folder name is the tag `wellfed.run_key` (runs.Run.tags)."""
    return {"derived.world_size": ray_cfg.num_workers, "derived.use_gpu": use_gpu,
            "derived.accumulation_steps": job.train.accumulation_steps(ray_cfg.num_workers),
            "derived.model_source": job.model_source, "derived.storage": run.storage_uri,
            "derived.engine": engine}


def forget(uri: str, run_id: str) -> None:
    """Delete an MLflow run that holds nothing yet (MLflow's deleted state: `mlflow gc` purges
    it, `mlflow runs restore` brings it back); MLflow down: the stage's own error says more."""
    import mlflow

    with contextlib.suppress(Exception):
        mlflow.MlflowClient(uri).delete_run(run_id)


@contextlib.contextmanager
def marked_failed(uri: str, run_id: str):
    """An error raised inside marks the MLflow run FAILED (Ctrl-C: KILLED), as a failure in
    training does: the stage did not finish. A rerun resumes the run and sets it running."""
    try:
        yield
    except BaseException as err:
        import mlflow

        status = "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED"
        with contextlib.suppress(Exception):  # MLflow down: the stage's own error says more
            mlflow.MlflowClient(uri).set_terminated(run_id, status)
        raise


def marked_killed(uri: str, run_id: str):
    """What marks the MLflow run KILLED on a stop at once (the process then ends: no `with`
    block around the run gets to end it)."""
    def mark() -> None:
        import mlflow

        mlflow.MlflowClient(uri).set_terminated(run_id, "KILLED")

    return mark


@contextlib.contextmanager
def marked_killed_on_stop(uri: str, run_id: str):
    """A stop on a signal marks the MLflow run KILLED: resumable, not failed (a rerun sets it
    running again). For a run no fluent `mlflow.start_run` holds (one placed Ray task)."""
    try:
        yield
    except preemption.Stopped:
        with contextlib.suppress(Exception):  # MLflow down: the stop's own line says more
            marked_killed(uri, run_id)()
        raise
