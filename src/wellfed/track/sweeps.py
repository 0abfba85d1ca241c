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
    import mlflow

    with tracking.store_lock(uri):
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(
            experiment, tags=dict([tracking.EXPERIMENT_KIND]))
        found = client.search_runs([exp_id], f"tags.`{PARENT}` = '{sweep}'", max_results=1)
        if found:
            return found[0].info.run_id
        run = client.create_run(exp_id, run_name=f"sweep {sweep}",
                                tags={PARENT: sweep, SWEEP_TAG: sweep})
        client.set_terminated(run.info.run_id, "FINISHED")  # a heading: it trains nothing
        return run.info.run_id
