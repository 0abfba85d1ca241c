"""A sweep is one thing: its trials (queued `dvc exp run` variants given the same
`mlflow.sweep`) carry the tag wellfed.sweep and are nested, in the MLflow UI, under one parent
run named `sweep <id>`. The parent trains and evaluates nothing (`wellfed-compare sweep:<id>`
leaves it out of the trials): it holds the sweep's summary, brought up to date by each trial's
evaluate stage (wellfed.compare.sweep_summary)."""

from __future__ import annotations

from wellfed.track import tracking

SWEEP_TAG = "wellfed.sweep"
"""The MLflow tag a sweep's trials carry, its value the sweep's id."""
PARENT = "wellfed.sweep_parent"


def tags(uri: str, experiment: str, sweep: str) -> dict[str, str]:
    """The tags that make a run a trial of `sweep` ({} without one): the sweep id and its
    parent run, made by the first trial under the store's lock (trials start together)."""
    if not sweep:
        return {}
    return {SWEEP_TAG: sweep, "mlflow.parentRunId": parent_run(uri, experiment, sweep)}


def parent_run(uri: str, experiment: str, sweep: str) -> str:
    """The sweep's parent run, made by the first trial. On a tracking server, where no lock
    file serialises the trials, two starting at once may both make one: each then keeps the
    earliest made (every trial sees it: it was there before any other was made) and deletes its
    own if it is not that one, so every trial nests under the same parent. (Start times are
    the clients' clocks: two machines whose clocks differ by more than the moment it takes to
    make a run could still keep one each.)"""
    import mlflow

    with tracking.store_lock(uri):
        client = mlflow.MlflowClient(uri)
        exp_id = tracking.experiment_id(client, experiment)
        found = parents(client, exp_id, sweep)
        if found:
            return found[0].info.run_id
        run = client.create_run(exp_id, run_name=f"sweep {sweep}",
                                tags={PARENT: sweep, SWEEP_TAG: sweep})
        client.set_terminated(run.info.run_id, "FINISHED")  # a heading: it trains nothing
        first = parents(client, exp_id, sweep)[0].info.run_id
        if first != run.info.run_id:
            client.delete_run(run.info.run_id)
        return first


def parents(client, exp_id: str, sweep: str) -> list:
    """The sweep's parent runs, earliest made first (its id breaks a tie of start times)."""
    found = client.search_runs([exp_id], f"tags.`{PARENT}` = '{sweep}'", max_results=100)
    return sorted(found, key=lambda r: (r.info.start_time, r.info.run_id))
