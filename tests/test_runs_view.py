"""Saved views of the runs table (wellfed.track.runs_view), saved on a real sqlite store as
MLflow 3's UI keeps them; what the UI then shows is checked in headless Chromium by
tests/e2e/test_ui.py."""

from __future__ import annotations

import json

import mlflow
import pytest

from wellfed.search.rungs import Rungs
from wellfed.track import runs_view


def test_the_view_is_saved_once_and_make_ui_prints_its_address(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs_view.main([uri])  # no store yet: nothing made, the UI's address
    assert capsys.readouterr().out == (f"no runs yet in {uri} (`make run` makes some); the UI: "
                                       "http://127.0.0.1:5000/#/experiments?"
                                       "workflowType=machine_learning\n")
    assert not (tmp_path / "mlflow.db").exists()
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("wellfed")
    trained = client.create_run(exp).info.run_id  # trained, not evaluated yet: no view
    client.log_metric(trained, "train/seconds", 3.0)
    assert runs_view.addresses(uri) == [
        f"runs of 'wellfed': http://127.0.0.1:5000/#/experiments/{exp}/runs?"
        "workflowType=machine_learning",
        "registered models (@champion: the best on the test split): "
        "http://127.0.0.1:5000/#/models?workflowType=machine_learning"]
    for key, value in (("eval/accuracy", 0.9), ("eval/macro_f1", 0.8), ("eval/ece", 0.1)):
        client.log_metric(trained, key, value)
    lines = runs_view.addresses(uri)
    assert lines[0] == (f"runs of 'wellfed' (best eval/macro_f1 first): http://127.0.0.1:5000/#"
                        f"/experiments/{exp}/runs?viewStateShareKey=wellfed-headline&"
                        "workflowType=machine_learning")
    saved = json.loads(client.get_experiment(exp).tags["mlflow.sharedViewState.wellfed-headline"])
    assert saved["name"] == "Headline (wellfed)" and saved["createdAt"] == saved["updatedAt"]
    state = json.loads(saved["state"])
    columns = ["metrics.`eval/macro_f1`", "tags.`wellfed.alias`", "metrics.`eval/accuracy`",
               "metrics.`eval/ece`", "metrics.`train/real_tokens_per_s`",
               "metrics.`train/seconds`", "params.`model.name`", "params.`train.lr`",
               "params.`train.warmup_ratio`", "params.`train.weight_decay`",
               "params.`train.epochs`", "params.`train.max_steps`",
               "params.`train.global_batch_size`", "params.`train.seed`", "attributes.`Models`"]
    assert state["orderByKey"] == "metrics.`eval/macro_f1`" and state["orderByAsc"] is False
    assert state["selectedColumns"] == state["columnOrder"] == columns
    assert state["searchFilter"] == ("tags.`wellfed.compare` IS NULL AND "
                                     "tags.`wellfed.sweep_parent` IS NULL AND "
                                     "tags.`wellfed.group` IS NULL")
    charts = state["compareRunCharts"]
    assert [c["metricKey"] for c in charts] == ["eval/macro_f1", "eval/accuracy", "eval/ece",
                                                "train/real_tokens_per_s", "train/seconds"]
    assert {c["metricSectionId"] for c in charts} == {state["compareRunSections"][0]["uuid"]}
    # A view the user changed in the UI (Views -> Override) stays theirs.
    client.set_experiment_tag(exp, runs_view.TAG, json.dumps({**saved, "state": "{}"}))
    assert not runs_view.save(uri, exp, runs_view.headline(["eval/pearson"]))
    assert json.loads(client.get_experiment(exp).tags[runs_view.TAG])["state"] == "{}"


def test_the_headline_views_filter_leaves_out_comparisons_and_keeps_every_pipeline_run(tmp_path):
    """`wellfed-compare a b c --vs d e f` logs a run of its own, tagged wellfed.compare; a
    sweep's parent, a search's parent and its trials are tagged wellfed.group (they have no
    test figures: rows of "-"). The view's filter, run by the store itself, keeps every other
    run, tagged or not: a sweep's trials and a search's winner are pipeline runs."""
    from wellfed.search import story
    from wellfed.track import sweeps

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("wellfed")
    plain = client.create_run(exp).info.run_id
    tagged = client.create_run(exp, tags={"wellfed.alias": "@champion"}).info.run_id
    client.create_run(exp, tags={runs_view.COMPARISON: "seeds"})
    sweep = sweeps.parent_run(uri, "wellfed", "lr")  # as a sweep's first trial makes it
    trial = client.create_run(exp, tags={sweeps.SWEEP_TAG: "lr", "mlflow.parentRunId": sweep})
    search = story.parent_run(uri, "wellfed", "s-1", {})
    teller = story.Story(uri, search, "s-1", "search", tmp_path / "s", "val/macro_f1",
                         Rungs([4], 2, False), 8)
    teller.start("aaaa1111", {"train.lr": 1e-4})  # a search trial's child run
    winner = client.create_run(exp, tags={story.SEARCH_TAG: "s-1", story.PHASE_TAG: "winner",
                                          "mlflow.parentRunId": search}).info.run_id
    assert len(client.search_runs([exp])) == 8
    assert runs_view.SWEEP_PARENT == sweeps.PARENT
    filtered = client.search_runs([exp], runs_view.headline(["eval/macro_f1"]).filter)
    assert sorted(r.info.run_id for r in filtered) == sorted([plain, tagged, trial.info.run_id,
                                                              winner])


@pytest.mark.integration
def test_a_search_parent_saves_a_view_of_its_trials_by_its_objective(tmp_path):
    """The general part: a view of one parent's trials, ranked by a loss (lower is better),
    with the knobs it varied as columns."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("search")
    view = runs_view.View("search-7", "Search 7", "val/loss", higher_is_better=False,
                          params=("train.lr", "train.warmup_ratio"),
                          filter="tags.`mlflow.parentRunId` = 'abc'", models=False)
    assert runs_view.save(uri, exp, view) and not runs_view.save(uri, exp, view)
    state = json.loads(json.loads(
        client.get_experiment(exp).tags["mlflow.sharedViewState.search-7"])["state"])
    assert state["orderByKey"] == "metrics.`val/loss`" and state["orderByAsc"] is True
    assert state["columnOrder"] == ["metrics.`val/loss`", "params.`train.lr`",
                                    "params.`train.warmup_ratio`"]
    assert state["searchFilter"] == "tags.`mlflow.parentRunId` = 'abc'"
    assert runs_view.address(uri, exp, view) == (
        f"http://127.0.0.1:5000/#/experiments/{exp}/runs?viewStateShareKey=search-7&"
        "workflowType=machine_learning")


def test_regression_ranks_by_pearson():
    assert runs_view.ranked_first(["eval/mse", "eval/spearman", "eval/pearson"]) == [
        "eval/pearson", "eval/mse", "eval/spearman"]
    assert runs_view.headline(["eval/mse", "eval/pearson"]).ranked == "eval/pearson"
