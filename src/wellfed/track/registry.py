"""The Model Registry by merit: every run's model becomes a version, and one alias (`champion`,
mlflow.champion_alias) points at the best of them, so `models:/<name>@champion` serves the best
model rather than the latest experiment.

The evaluate stage ranks: a version scored on the test split (validation when there is none) is
compared with the alias holder by the task's headline figure (`headline`), and only when both
scored the same split (the tokenize stage's fingerprint of its row ids, texts and labels) can
one beat the other. The alias moves only to a strictly better version. Every evaluated version
keeps what it scored and why it is or is not the champion in its tags, and the registered
version and the logged model name each other (the UI shows the link both ways).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass


def headline(task: str) -> str:
    """The figure versions are ranked by: the task's headline (wellfed.tasks.HEADLINE) on the
    evaluated split, eval/macro_f1 or eval/pearson; higher is better for each."""
    from wellfed.tasks import HEADLINE

    return "eval/" + HEADLINE[task].split("/", 1)[1]

# Version tags: what the version scored, on which split, and the alias decision in words.
METRIC, VALUE, SPLIT = "wellfed.eval.metric", "wellfed.eval.value", "wellfed.eval.split"
SPLIT_NAME = "wellfed.eval.split_name"
REASON, PREVIOUS = "wellfed.champion.reason", "wellfed.champion.previous"
MODEL_VERSIONS = "mlflow.modelVersions"
"""The logged-model tag MLflow's UI reads for "Model versions" (a JSON list of name/version);
MLflow sets it when it registers through its REST server, not through a local sqlite store."""


@dataclass(frozen=True)
class Verdict:
    """One version's evaluation against the alias holder."""

    name: str
    version: str
    alias: str
    holder: str | None
    """The alias holder after the decision (the version itself when it moved)."""
    moved: bool
    reason: str

    def line(self) -> str:
        """The console line: where the alias points now, and why."""
        uri = f"models:/{self.name}@{self.alias}"
        if self.moved:
            return f"{uri} -> version {self.version}: {self.reason}"
        if self.holder is None:
            return f"{uri} is not set: version {self.version} {self.reason}"
        return f"{uri} stays version {self.holder}: version {self.version} {self.reason}"


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
    registered_model, model_version."""
    from wellfed.use import serving

    info, version = serving.log_model(uri, run_id, model_dir, name)
    link(uri, info.model_id, version.name, version.version)
    return {"model_id": info.model_id, "registered_model": version.name,
            "model_version": str(version.version)}


def holder(client, name: str, alias: str):
    """The version the alias points at, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:  # no such alias (or model): nothing to beat
        return None


def number(version) -> str:
    """A version number as text (stores differ: sqlite gives int, REST str)."""
    return str(version.version)


def judge(version: str, metric: str, value: float, split: str, split_name: str,
          current) -> tuple[bool, str]:
    """(moves, why): whether `version` scoring `value` on `split` takes the alias from
    `current` (a ModelVersion or None), in words that name the metric, both values and the
    previous holder."""
    figure = f"{metric} {value:.4f} on the {split_name} split"
    if not math.isfinite(value):
        return False, f"scored {metric} {value}: not a finite figure, never ranked"
    if current is None:
        return True, f"{figure}; no version held the alias"
    tags = current.tags
    theirs = f"version {number(current)}"
    if tags.get(SPLIT) != split or tags.get(METRIC) != metric:
        scored = (f"{tags[METRIC]} on another split ({tags.get(SPLIT_NAME, '?')}, "
                  f"fingerprint {tags[SPLIT][:12]})" if SPLIT in tags and METRIC in tags
                  else "no recorded evaluation")
        return False, (f"scored {figure}, and {theirs} has {scored}: the two cannot be ranked; "
                       f"point the alias at version {version} by hand if this split is the one "
                       "to judge by")
    best = float(tags[VALUE])
    if value > best:
        return True, f"{figure} beats {theirs}'s {best:.4f} on the same split"
    return False, f"scored {figure}, not above {theirs}'s {best:.4f} on the same split"


def promote(uri: str, name: str, version: str | int, alias: str, metric: str, value: float,
            split: str, split_name: str) -> Verdict:
    """Record what `version` scored and move `alias` to it when it beats the holder (module
    docstring); its tags say why either way (REASON, and PREVIOUS when it moved)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    version = str(version)
    for key, text in ((METRIC, metric), (VALUE, repr(float(value))), (SPLIT, split),
                      (SPLIT_NAME, split_name)):
        client.set_model_version_tag(name, version, key, text)
    with ranking(client, name, alias):  # read, judge, move and say why: one step
        current = holder(client, name, alias)
        if current is not None and number(current) == version:  # evaluated again: still holds it
            return Verdict(name, version, alias, version, False, "holds it already")
        moves, why = judge(version, metric, float(value), split, split_name, current)
        if moves:
            client.set_registered_model_alias(name, alias, version)
            client.set_model_version_tag(name, version, PREVIOUS,
                                         number(current) if current is not None else "none")
        client.set_model_version_tag(name, version, REASON, f"@{alias}: {why}" if moves else
                                     f"not @{alias}: {why}")
    return Verdict(name, version, alias,
                   version if moves else (number(current) if current is not None else None),
                   moves, why)


LOCK_STALE_S = 60.0
"""A ranking lock older than this was left by an evaluation killed inside it (a ranking takes
well under a second): the next one removes it."""


@contextlib.contextmanager
def ranking(client, name: str, alias: str, wait_s: float = 120.0):
    """Hold the store-wide lock on ranking versions of `name` for `alias`. Two evaluations at
    once (trials finishing together, on any nodes) each read the holder before the other moved
    it, and the last alias write won, not the better version: through a tracking server both
    versions of an exact overlap took the alias "from no version", and in one round of two the
    worse one kept it (tests/e2e/test_team_checks.py). MLflow has no compare-and-set, but creating
    a registered model that exists fails in the store's own database: a registered model named
    `<name>.<alias>.lock`, made and deleted around the decision, is the lock (the registry lists
    it only while a ranking runs, or until the next one after a killed evaluation)."""
    from mlflow.exceptions import MlflowException

    lock = f"{name}.{alias}.lock"
    deadline = time.time() + wait_s
    while True:
        try:
            client.create_registered_model(lock, description=(
                f"held while wellfed ranks a version of {name} for @{alias} (under a second); "
                f"one older than {LOCK_STALE_S:g} s is stale and removed by the next ranking"))
            break
        except MlflowException as err:
            if "already exists" not in str(err).lower() and "ALREADY_EXISTS" not in str(err):
                raise
        with contextlib.suppress(MlflowException):  # held: by whom, since when
            made = client.get_registered_model(lock).creation_timestamp / 1000
            if time.time() - made > LOCK_STALE_S:
                client.delete_registered_model(lock)
                continue
        if time.time() > deadline:
            raise TimeoutError(f"models:/{name}@{alias} stayed locked by another evaluation for "
                               f"{wait_s:g} s; delete the registered model {lock} if none runs")
        time.sleep(0.2)
    try:
        yield
    finally:
        with contextlib.suppress(MlflowException):
            client.delete_registered_model(lock)


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
            client.delete_tag(run.info.run_id, ALIAS_TAG)
    for run_id, mark in marks.items():
        client.set_tag(run_id, ALIAS_TAG, mark)
    return marks


def local_files(uri: str, model_id: str | None):
    """The folder on this machine holding the files of logged model `model_id` as it was
    given them (serving.log_model's artifact `model`, a copy of data/model), or None: no model,
    or an artifact store elsewhere (a tracking server's, s3://...)."""
    import mlflow

    from wellfed.use.registered import logged_files

    return logged_files(mlflow.MlflowClient(uri), model_id) if model_id else None
