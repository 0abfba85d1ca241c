"""The runs table's headline view (wellfed.track.runs_view), saved on a real sqlite store as
MLflow 3's UI keeps saved views; what the UI then shows was checked with headless Chromium
(docs/mlflow.md, "In the UI")."""

from __future__ import annotations

import json

import mlflow

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
    assert json.loads(saved["state"]) == {
        "orderByKey": "metrics.`eval/macro_f1`", "orderByAsc": False,
        "selectedColumns": ["attributes.`Models`", "tags.`wellfed.alias`",
                            "metrics.`eval/macro_f1`",
                            "metrics.`eval/accuracy`", "metrics.`eval/ece`",
                            "metrics.`train/real_tokens_per_s`", "metrics.`train/seconds`"]}
    # A view the user changed in the UI (Views -> Override) stays theirs.
    client.set_experiment_tag(exp, runs_view.TAG, json.dumps({**saved, "state": "{}"}))
    assert runs_view.save(uri, exp, ["eval/pearson"])
    assert json.loads(client.get_experiment(exp).tags[runs_view.TAG])["state"] == "{}"


def test_regression_ranks_by_pearson():
    assert runs_view.ranked_first(["eval/mse", "eval/spearman", "eval/pearson"]) == [
        "eval/pearson", "eval/mse", "eval/spearman"]
