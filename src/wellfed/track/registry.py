"""The Model Registry by merit: every run's model becomes a version, and one alias (`champion`,
mlflow.champion_alias) points at the best of them, so `models:/<name>@champion` serves the best
model rather than the latest experiment.

The train stage registers (`register`): a rerun of an interrupted run first removes what the
interrupted attempt registered (a version no evaluation scored, a logged model no version
names), so a run has one version. The evaluate stage ranks (track/champion.py): the version's
figures, the alias and every version's reason are one consistent step. The registered version
and the logged model name each other (the UI shows the link both ways).
"""

from __future__ import annotations

import json


def headline(task: str) -> str:
    """The figure versions are ranked by: the task's headline (wellfed.tasks.HEADLINE) on the
    evaluated split, eval/macro_f1 or eval/pearson; higher is better for each."""
    from wellfed.tasks import HEADLINE

    return "eval/" + HEADLINE[task].split("/", 1)[1]

# Version tags: what the version scored, on which split, and the alias decision in words
# (track/champion.py writes them; `register` reads them to tell a scored version from an
# interrupted attempt).
METRIC, VALUE, SPLIT = "wellfed.eval.metric", "wellfed.eval.value", "wellfed.eval.split"
SPLIT_NAME = "wellfed.eval.split_name"
RECIPE = "wellfed.eval.recipe"
"""`lr 1e-4 bs 32`, from the version's run: its description leads with it (the versions list
shows the first ~40 characters)."""
REASON, PREVIOUS = "wellfed.champion.reason", "wellfed.champion.previous"
EXCLUDE = "wellfed.champion.exclude"
"""A version tag (any value) set by hand: never ranked for the alias (a model found faulty)."""
MODEL_VERSIONS = "mlflow.modelVersions"
"""The logged-model tag MLflow's UI reads for "Model versions" (a JSON list of name/version);
MLflow sets it when it registers through its REST server, not through a local sqlite store."""


def link(uri: str, model_id: str, name: str, version: str | int) -> None:
    """Tell the logged model which registered version it became (its page lists it)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    entry = {"name": name, "version": str(version)}
    known = json.loads(client.get_logged_model(model_id).tags.get(MODEL_VERSIONS) or "[]")
    if entry not in known:
        client.set_logged_model_tags(model_id, {MODEL_VERSIONS: json.dumps(known + [entry])})


def register(uri: str, run_id: str, model_dir, name: str) -> dict:
    """Log `model_dir` as the run's model, register it as the next version of `name` and link
    the two; return the record evaluate ranks it by (data/train/run.json): model_id,
    registered_model, model_version. What an interrupted attempt of the same run registered
    goes first (`unfinished`), so that a rerun leaves one version per run."""
    from wellfed.use import logged_model

    for line in remove_unfinished(uri, run_id, name):
        print(f"[wellfed] {line}", flush=True)
    info, version = logged_model.log_model(uri, run_id, model_dir, name)
    link(uri, info.model_id, version.name, version.version)
    return {"model_id": info.model_id, "registered_model": version.name,
            "model_version": str(version.version)}


def model_id_of(version) -> str | None:
    """The logged model a version was registered from (a sqlite store leaves `model_id` empty;
    its source is then models:/<model id>)."""
    return getattr(version, "model_id", None) or (
        version.source.removeprefix("models:/") if version.source.startswith("models:/m-")
        else None)


def unfinished(client, run_id: str, name: str) -> tuple[list, list]:
    """(versions, logged models) that an interrupted attempt of run `run_id` left: its versions
    of `name` that no evaluation scored and no alias points at (the train stage registers last,
    so a version of an unfinished run was never evaluated), and its logged models that no
    remaining version names (killed between logging and registering)."""
    from mlflow.exceptions import MlflowException

    try:
        aliases = set(map(str, client.get_registered_model(name).aliases.values()))
    except MlflowException:  # the model's first version is yet to come: nothing to remove
        aliases = set()
        versions = []
    else:
        versions = client.search_model_versions(f"name = {quoted(name)} and run_id = '{run_id}'")
    stale = [v for v in versions if str(v.version) not in aliases and METRIC not in v.tags]
    gone = {str(v.version) for v in stale}
    kept = {model_id_of(v) for v in versions if str(v.version) not in gone}
    experiment = client.get_run(run_id).info.experiment_id
    models = [m for m in client.search_logged_models([experiment],
                                                     f"source_run_id = '{run_id}'")
              if m.model_id not in kept]
    return stale, models


def remove_unfinished(uri: str, run_id: str, name: str) -> list[str]:
    """Delete what `unfinished` finds; return a line for each version removed."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    versions, models = unfinished(client, run_id, name)
    for version in versions:
        client.delete_model_version(name, str(version.version))
    for model in models:
        client.delete_logged_model(model.model_id)
    return [f"removed version {v.version} of {name}: an interrupted attempt of this run "
            "registered it, and this attempt registers the model again" for v in versions]


def quoted(text: str) -> str:
    """A string literal for MLflow's search filters."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


ALIAS_TAG = "wellfed.alias"
"""Run tag: the aliases its registered version holds (`@champion`), for the runs table's
headline view, whose Models column names a run's version but not its aliases."""


def mark_aliases(uri: str) -> dict[str, str]:
    """Tag each run whose registered version holds an alias with them, and untag every other
    run (the alias moved, or was pointed by hand); return run id -> tag."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    held: dict[str, list[str]] = {}
    for model in client.search_registered_models(max_results=1000):
        for alias, version in sorted(model.aliases.items()):
            run_id = client.get_model_version(model.name, str(version)).run_id
            held.setdefault(run_id, []).append(f"@{alias}")
    marks = {run_id: " ".join(names) for run_id, names in held.items() if run_id}
    ids = [e.experiment_id for e in client.search_experiments()]
    for run in client.search_runs(ids, f"tags.`{ALIAS_TAG}` LIKE '@%'", max_results=1000):
        if run.info.run_id not in marks:
            untag(client, run.info.run_id)
    for run_id, mark in marks.items():
        client.set_tag(run_id, ALIAS_TAG, mark)
    return marks


def untag(client, run_id: str) -> None:
    """Remove ALIAS_TAG from a run; already gone is done: the evaluate stages of a sweep's
    trials, finishing together, each untag the run the alias left (one of three queued trials
    failed so, `No tag with name: wellfed.alias`, in the e2e sweep of 2026-11-29)."""
    from mlflow.exceptions import MlflowException

    try:
        client.delete_tag(run_id, ALIAS_TAG)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise


def local_files(uri: str, model_id: str | None):
    """The folder on this machine holding the files of logged model `model_id` as it was
    given them (logged_model.log_model's artifact `model`, a copy of data/model), or None: no model,
    or an artifact store elsewhere (a tracking server's, s3://...)."""
    import mlflow

    from wellfed.use.registered import logged_files

    return logged_files(mlflow.MlflowClient(uri), model_id) if model_id else None
