"""Any label text works where a name is required: safe, distinct keys; the evaluate stage, run as
a user runs it, writes them to the metrics file and MLflow and keeps the label text beside them."""

import json
import subprocess
import sys

import mlflow
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.entities import Metric

from tests.conftest import PROJECT
from wellfed.names import MAX_CHARS, keys

AWKWARD = ["refund?", "card/lost", "naïve café"]


def test_safe_labels_keep_their_text_and_awkward_ones_are_cleaned():
    assert keys(["negative", "neutral", "positive"]) == ["negative", "neutral", "positive"]
    assert keys(["-1", "0", "1", "_x", "日本語"]) == ["-1", "0", "1", "_x", "日本語"]
    assert keys(AWKWARD) == ["refund", "card_lost", "naïve_café"]
    assert keys(["reverted_card_payment?", "3.5", "a / b", "???"]) == [
        "reverted_card_payment", "3_5", "a_b", "label"]


def test_labels_that_clean_to_the_same_key_stay_distinct():
    out = keys(["refund", "refund?", "refund!", "naïve café", "nai\u0308ve cafe\u0301"])
    assert out[0] == "refund"  # the label that is already a key keeps it
    assert out[1].startswith("refund-") and out[2].startswith("refund-") and len(out[1]) == 13
    assert out[3].startswith("naïve_café-") and out[4].startswith("naïve_café-")
    assert len(set(out)) == 5
    assert keys(["refund?", "refund"])[0] == out[1]  # the suffix depends on the label alone
    assert keys(["x" * 100, "x" * 99 + "y"])[0] != keys(["x" * 100, "x" * 99 + "y"])[1]
    tricky = keys(["refund?", "refund", out[1]])  # a label spelled like another's suffixed key
    assert tricky[2] == out[1] and len(set(tricky)) == 3


def test_repeated_labels_are_refused():
    with pytest.raises(ValueError, match=r"label names must be distinct; repeated: \['a'\]"):
        keys(["a", "b", "a"])


@pytest.mark.integration
@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=80), min_size=1, max_size=12, unique=True))
def test_any_labels_give_distinct_keys_that_nest_nothing(labels):
    out = keys(labels)
    assert len(out) == len(labels) == len(set(out))
    for key in out:
        assert key and "/" not in key and "." not in key and " " not in key
        assert len(key) <= MAX_CHARS + 41
        assert mlflow.utils.validation.validate_param_and_metric_name(f"eval/{key}/f1")


@pytest.mark.integration
def test_mlflow_stores_every_key(tmp_path):
    labels = AWKWARD + ["reverted_card_payment?", "a.b", "x/../y", "$5 - $10", "tab\there", "ü" * 90]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("names")).info.run_id
    metrics = [Metric(f"eval/{key}/f1", 0.5, 0, 0) for key in keys(labels)]
    client.log_batch(run_id, metrics=metrics)
    assert len(client.get_run(run_id).data.metrics) == len(labels) == 9


@pytest.fixture(scope="module")
def scored(tmp_path_factory, tiny_model_dir):
    """The evaluate stage on a 3-class test split whose labels are awkward, into a real MLflow run."""
    from wellfed.config import ModelConfig
    from wellfed.data.token_files import TokenBatch, write_token_file
    from wellfed.model import load_model
    from wellfed.train.outputs import run_record

    root = tmp_path_factory.mktemp("evaluate")
    tokens = root / "tokens"
    tokens.mkdir()
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 12, size=30).astype(np.int32)
    write_token_file(tokens / "test.arrow", [TokenBatch(
        rng.integers(1000, 3000, size=int(lengths.sum())).astype(np.int32), lengths,
        np.arange(30) % 3, np.arange(30))])
    (tokens / "meta.json").write_text(json.dumps({"labels": AWKWARD, "pad_id": 0}))
    load_model(ModelConfig(init="random"), str(tiny_model_dir), AWKWARD).save_pretrained(
        root / "model")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("evaluate")).info.run_id
    run_record.write(root / "run.json", root / "model", {"mlflow_run_id": run_id,
                                                         "tracking_uri": uri})
    (root / "params.yaml").write_text("mlflow: {}\n")  # evaluate reads mlflow.champion_alias
    proc = subprocess.run([sys.executable, str(PROJECT / "stages" / "evaluate.py"), "tokens", "model",
                           "run.json", "no-outputs.npz", "eval"], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root, client, run_id


@pytest.mark.integration
def test_evaluate_keys_the_per_class_table_by_safe_key_and_keeps_the_label_text(scored):
    root, client, run_id = scored
    assert set(json.loads((root / "eval" / "metrics.json").read_text())) == {
        "eval/accuracy", "eval/macro_f1", "eval/ece"}  # the DVC metrics: headline only
    metrics = json.loads((root / "eval" / "report.json").read_text())
    assert list(metrics["per_class"]) == ["refund", "card_lost", "naïve_café"]
    assert [c["label"] for c in metrics["per_class"].values()] == AWKWARD
    assert sum(c["support"] for c in metrics["per_class"].values()) == 30
    # MLflow: the headline as metrics, the classes as one table (key beside the label text)
    assert set(client.get_run(run_id).data.metrics) == {"eval/accuracy", "eval/macro_f1", "eval/ece"}
    table = json.loads(mlflow.artifacts.load_text(
        f"{client.get_run(run_id).info.artifact_uri}/eval/per_class.json"))
    assert table["columns"][:2] == ["key", "label"]
    assert [row[:2] for row in table["data"]] == [["refund", "refund?"], ["card_lost", "card/lost"],
                                                  ["naïve_café", "naïve café"]]


@pytest.mark.integration
def test_evaluate_writes_label_text_where_it_is_data(scored):
    root, _, _ = scored
    preds = pd.read_parquet(root / "eval" / "predictions.parquet")
    assert preds["gold"].tolist() == [AWKWARD[i % 3] for i in range(30)]
    assert set(preds["predicted"]) <= set(AWKWARD)
    assert list(preds.columns[3:]) == ["prob_refund", "prob_card_lost", "prob_naïve_café"]
    confusion = pd.read_csv(root / "eval" / "confusion.csv")
    assert confusion["gold"].tolist() == preds["gold"].tolist()
    assert (root / "eval" / "confusion.png").stat().st_size > 1000
    assert (root / "eval" / "reliability.png").stat().st_size > 1000


@pytest.mark.integration
def test_an_mlflow_failure_in_evaluate_is_one_line_naming_the_call(scored):
    root, _, _ = scored
    run = json.loads((root / "run.json").read_text())
    (root / "gone.json").write_text(json.dumps({**run, "mlflow_run_id": "0" * 32}))
    proc = subprocess.run([sys.executable, str(PROJECT / "stages" / "evaluate.py"), "tokens", "model",
                           "gone.json", "no-outputs.npz", "eval-gone"], cwd=root,
                          capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()  # above it: the progress bars of model loading, predict
    assert [line for line in lines if "error" in line.lower()] == lines[-1:]
    assert lines[-1].startswith("error: MLflow failed in tracking.log_artifacts (called from "
                                "evaluate.py line "), lines
    assert lines[-1].endswith(f"Run with id={'0' * 32} not found"), lines
    assert "Traceback" not in proc.stderr
