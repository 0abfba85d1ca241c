"""The registry around the champion (tests/test_champion.py has the alias itself), on a real
sqlite MLflow store: a rerun of an interrupted run leaves one version, the logged model and the
version name each other, and the alias holder's run is tagged."""

from __future__ import annotations

import json

import mlflow
import pytest

from wellfed.track import champion, registry

NAME, ALIAS, METRIC = "demo-classifier", "champion", "eval/macro_f1"
SPLIT = "a" * 64


@pytest.fixture()
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("demo")
    client.create_registered_model(NAME)

    def version() -> str:
        run_id = client.create_run(experiment).info.run_id
        return client.create_model_version(NAME, f"{tmp_path}/model", run_id=run_id).version

    return uri, client, version


def test_the_logged_model_names_its_registered_version(store):
    uri, client, _ = store
    experiment = client.get_experiment_by_name("demo").experiment_id
    model = client.create_logged_model(experiment, name="demo")
    registry.link(uri, model.model_id, NAME, 4)
    registry.link(uri, model.model_id, NAME, 4)  # idempotent
    tags = client.get_logged_model(model.model_id).tags
    assert json.loads(tags["mlflow.modelVersions"]) == [{"name": NAME, "version": "4"}]


@pytest.mark.parametrize("task, metric", [("single_label", "eval/macro_f1"),
                                          ("multi_label", "eval/macro_f1"),
                                          ("regression", "eval/pearson")])
def test_each_task_ranks_by_its_headline(task, metric):
    assert registry.headline(task) == metric


def test_the_run_note_says_where_the_version_stands():
    """The note's registry line, for a version that took the alias and one that did not."""
    from types import SimpleNamespace

    from wellfed.track import run_note

    run = SimpleNamespace(data=SimpleNamespace(metrics={"val/macro_f1": 0.9}, params={},
                                               tags={}),
                          inputs=SimpleNamespace(dataset_inputs=[]))
    model = {"registered_model": NAME, "model_version": "3"}
    stays = champion.Verdict(NAME, "3", ALIAS, "2", "2", "scored eval/macro_f1 0.7000 ...")
    note = run_note.compose(run, "single_label", ["a", "b"], model=model, verdict=stays)
    assert note.splitlines()[0] == ("### val/macro_f1 0.9000 (last validation; the test split "
                                    "is scored by the evaluate stage)")
    assert ("- **registry** [models:/demo-classifier/3](#/models/demo-classifier/versions/3"
            "?workflowType=machine_learning); `models:/demo-classifier@champion` stays version 2: "
            "this one scored eval/macro_f1 0.7000 ...") in note


def test_the_alias_holders_run_is_tagged_and_the_tag_follows_the_alias(store):
    """The runs table shows a run's registered version, not its aliases: the holder's run is
    tagged `wellfed.alias`, and only it, also after the alias is pointed by hand."""
    uri, client, version = store
    v1, v2 = version(), version()
    run_of = {v: client.get_model_version(NAME, v).run_id for v in (v1, v2)}
    assert registry.mark_aliases(uri) == {}
    champion.promote(uri, NAME, v1, ALIAS, METRIC, 0.80, SPLIT, "test")
    assert registry.mark_aliases(uri) == {run_of[v1]: "@champion"}
    client.set_registered_model_alias(NAME, ALIAS, v2)  # by hand
    client.set_registered_model_alias(NAME, "staging", v2)
    assert registry.mark_aliases(uri) == {run_of[v2]: "@champion @staging"}
    assert registry.ALIAS_TAG not in client.get_run(run_of[v1]).data.tags
    assert client.get_run(run_of[v2]).data.tags[registry.ALIAS_TAG] == "@champion @staging"


def test_a_tag_another_evaluate_removed_first_is_not_an_error(store, monkeypatch):
    """Two trials' evaluate stages finishing together both untag the run the alias left: the
    second finds the tag gone (MLflow: RESOURCE_DOES_NOT_EXIST), which is what it wanted."""
    uri, client, version = store
    v1, v2 = version(), version()
    run_of = {v: client.get_model_version(NAME, v).run_id for v in (v1, v2)}
    champion.promote(uri, NAME, v1, ALIAS, METRIC, 0.80, SPLIT, "test")
    registry.mark_aliases(uri)
    client.set_registered_model_alias(NAME, ALIAS, v2)
    delete = mlflow.MlflowClient.delete_tag

    def raced(self, run_id, key):  # the other stage removes it between the search and here
        delete(self, run_id, key)
        return delete(self, run_id, key)

    monkeypatch.setattr(mlflow.MlflowClient, "delete_tag", raced)
    assert registry.mark_aliases(uri) == {run_of[v2]: "@champion"}
    assert registry.ALIAS_TAG not in client.get_run(run_of[v1]).data.tags

def test_a_rerun_after_a_kill_just_after_registering_leaves_one_version_per_run(
        tmp_path, tiny_model_dir):
    """The train stage killed right after registering (an attempt that logged and registered),
    and once more between logging and registering (a logged model without a version): the rerun
    of the same MLflow run registers once and removes both; another run's version, an evaluated
    one and the alias stay."""
    from tests.test_serving import save_model
    from wellfed.track import tracking

    model_dir = save_model(tiny_model_dir, tmp_path / "model", ["neg", "pos"],
                           "single_label_classification")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    other = tracking.start_run(uri, "demo", "other")
    kept = registry.register(uri, other, model_dir, NAME)["model_version"]
    champion.promote(uri, NAME, kept, ALIAS, METRIC, 0.7, SPLIT, "test")
    run_id = tracking.start_run(uri, "demo", "interrupted")
    killed = registry.register(uri, run_id, model_dir, NAME)  # ... and the process dies here
    experiment = client.get_run(run_id).info.experiment_id
    half = client.create_logged_model(experiment, source_run_id=run_id, name=NAME)  # and here
    assert [str(v.version) for v in client.search_model_versions(
        f"name = '{NAME}' and run_id = '{run_id}'")] == [killed["model_version"]]

    rerun = registry.register(uri, run_id, model_dir, NAME)
    versions = client.search_model_versions(f"name = '{NAME}' and run_id = '{run_id}'")
    assert [str(v.version) for v in versions] == [rerun["model_version"]] == ["3"]
    models = client.search_logged_models([experiment], f"source_run_id = '{run_id}'")
    assert [m.model_id for m in models] == [rerun["model_id"]]
    assert killed["model_id"] != rerun["model_id"] != half.model_id
    assert str(client.get_model_version_by_alias(NAME, ALIAS).version) == kept == "1"
    again = registry.register(uri, other, model_dir, NAME)  # an evaluated version is never removed
    assert {str(v.version) for v in client.search_model_versions(
        f"name = '{NAME}' and run_id = '{other}'")} == {kept, again["model_version"]}
