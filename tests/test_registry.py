"""The champion alias by merit, on a real sqlite MLflow store (no training: versions are made
directly, each from its own run)."""

from __future__ import annotations

import json

import mlflow
import pytest

from wellfed.track import registry

NAME, ALIAS, METRIC = "demo-classifier", "champion", "eval/macro_f1"
SPLIT, OTHER = "a" * 64, "b" * 64


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


def test_the_alias_moves_only_to_a_better_version_of_the_same_split(store):
    uri, client, version = store
    v1, v2, v3 = version(), version(), version()
    first = registry.promote(uri, NAME, v1, ALIAS, METRIC, 0.80, SPLIT, "test")
    assert first.moved and first.line() == (
        "models:/demo-classifier@champion -> version 1: eval/macro_f1 0.8000 on the test split; "
        "no version held the alias")
    worse = registry.promote(uri, NAME, v2, ALIAS, METRIC, 0.70, SPLIT, "test")
    assert not worse.moved and worse.holder == "1"
    assert "stays version 1: version 2 scored eval/macro_f1 0.7000" in worse.line()
    assert "not above version 1's 0.8000 on the same split" in worse.line()
    better = registry.promote(uri, NAME, v3, ALIAS, METRIC, 0.90, SPLIT, "test")
    assert better.moved and str(client.get_model_version_by_alias(NAME, ALIAS).version) == "3"
    tags = client.get_model_version(NAME, "3").tags
    assert tags[registry.REASON] == ("@champion: eval/macro_f1 0.9000 on the test split beats "
                                     "version 1's 0.8000 on the same split")
    assert tags[registry.PREVIOUS] == "1" and float(tags[registry.VALUE]) == 0.9
    assert tags[registry.SPLIT] == SPLIT and tags[registry.METRIC] == METRIC
    assert client.get_model_version(NAME, "2").tags[registry.REASON].startswith("not @champion: ")


def test_an_equal_score_or_another_split_or_nan_leaves_the_alias(store):
    uri, client, version = store
    v0, v1, v2, v3, v4 = version(), version(), version(), version(), version()
    nan = registry.promote(uri, NAME, v0, ALIAS, METRIC, float("nan"), SPLIT, "test")
    assert nan.line() == ("models:/demo-classifier@champion is not set: version 1 scored "
                          "eval/macro_f1 nan: not a finite figure, never ranked")
    registry.promote(uri, NAME, v1, ALIAS, METRIC, 0.80, SPLIT, "test")
    assert not registry.promote(uri, NAME, v2, ALIAS, METRIC, 0.80, SPLIT, "test").moved
    other = registry.promote(uri, NAME, v3, ALIAS, METRIC, 0.99, OTHER, "validation")
    assert not other.moved and "cannot be ranked" in other.reason
    assert "another split (test, fingerprint aaaaaaaaaaaa)" in other.reason
    assert not registry.promote(uri, NAME, v4, ALIAS, METRIC, float("nan"), SPLIT, "test").moved
    assert str(client.get_model_version_by_alias(NAME, ALIAS).version) == "2"
    again = registry.promote(uri, NAME, v1, ALIAS, METRIC, 0.80, SPLIT, "test")  # re-evaluated
    assert not again.moved and again.holder == "2"


def test_a_hand_set_alias_without_a_record_is_never_taken_silently(store):
    uri, client, version = store
    v1, v2 = version(), version()
    client.set_registered_model_alias(NAME, ALIAS, v1)
    verdict = registry.promote(uri, NAME, v2, ALIAS, METRIC, 0.95, SPLIT, "test")
    assert not verdict.moved and "no recorded evaluation" in verdict.reason


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
    stays = registry.Verdict(NAME, "3", ALIAS, "2", False, "scored eval/macro_f1 0.7000 ...")
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
    registry.promote(uri, NAME, v1, ALIAS, METRIC, 0.80, SPLIT, "test")
    assert registry.mark_aliases(uri) == {run_of[v1]: "@champion"}
    client.set_registered_model_alias(NAME, ALIAS, v2)  # by hand
    client.set_registered_model_alias(NAME, "staging", v2)
    assert registry.mark_aliases(uri) == {run_of[v2]: "@champion @staging"}
    assert registry.ALIAS_TAG not in client.get_run(run_of[v1]).data.tags
    assert client.get_run(run_of[v2]).data.tags[registry.ALIAS_TAG] == "@champion @staging"
