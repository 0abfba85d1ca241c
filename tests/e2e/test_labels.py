"""Awkward label text and the README's sweep command, through `dvc repro` / `dvc exp run` as a
user runs them: tiny random-init BERT, one Ray worker on CPU, real DVC and MLflow."""

import json

import pandas as pd
import pytest

from tests.e2e.pipeline import make_project, mlflow_runs, run

pytestmark = pytest.mark.e2e

# The demo data's three classes, renamed to labels that are no metric key as they stand.
RENAME = {"negative": "refund?", "neutral": "card/lost", "positive": "naïve café"}
KEYS = {"refund?": "refund", "card/lost": "card_lost", "naïve café": "naïve_café"}
ROWS = {"train.tsv": 160, "dev.tsv": 40, "test.tsv": 40}


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir):
    dest = tmp_path_factory.mktemp("labels")
    params = {"model": {"name": str(tiny_model_dir), "init": "random"},
              "train": {"epochs": 1, "lr": 2e-3, "global_batch_size": 16, "micro_batch_size": 16,
                        "eval_every": 0, "report_every": 5, "checkpoint_every": 0},
              "ray": {"num_workers": 1, "cpus_per_worker": 1}}
    make_project(dest, params, ROWS)
    for name in ROWS:
        path = dest / "data" / "raw" / name
        frame = pd.read_csv(path, sep="\t")
        frame["label"] = frame["label"].map(RENAME)
        assert frame["label"].notna().all()
        frame.to_csv(path, sep="\t", index=False)
    run(["git", "add", "-A"], dest)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "labels"], dest)
    proc = run(["dvc", "repro"], dest)
    return dest, proc


def test_label_text_is_kept_where_it_is_data(project):
    dest, _ = project
    names = json.loads((dest / "data/prepared/labels.json").read_text())["names"]
    assert names == ["card/lost", "naïve café", "refund?"]
    config = json.loads((dest / "data/model/config.json").read_text())
    assert config["id2label"] == {"0": "card/lost", "1": "naïve café", "2": "refund?"}
    preds = pd.read_parquet(dest / "data/eval/predictions.parquet")
    gold = pd.read_csv(dest / "data/raw/test.tsv", sep="\t")["label"]
    assert preds["gold"].tolist() == gold.tolist() and len(preds) == 40
    assert set(preds["predicted"]) <= set(RENAME.values())
    assert list(preds.columns[3:]) == ["prob_card_lost", "prob_naïve_café", "prob_refund"]


def test_the_eval_report_is_keyed_by_safe_keys_with_the_label_beside(project):
    dest, _ = project
    report = json.loads((dest / "data/eval/report.json").read_text())
    assert {k: c["label"] for k, c in report["per_class"].items()} == {
        "card_lost": "card/lost", "naïve_café": "naïve café", "refund": "refund?"}
    shown = json.loads(run(["dvc", "metrics", "show", "--json"], dest).stdout)
    headline = shown[""]["data"]["data/eval/metrics.json"]["data"]
    assert sorted(headline) == ["eval/accuracy", "eval/ece", "eval/macro_f1"]  # per-class: report
    run(["dvc", "plots", "show", "-o", "plots_html"], dest)  # the confusion template, label text
    assert (dest / "plots_html" / "index.html").is_file()


def test_mlflow_has_the_headline_keys_and_one_per_class_table_with_the_label_text(project):
    dest, _ = project
    client, runs = mlflow_runs(dest)
    assert len(runs) == 1
    logged = {k for k in runs[0].data.metrics if k.startswith("eval/")}
    assert logged == {"eval/accuracy", "eval/macro_f1", "eval/ece"}  # per class: the table
    local = client.download_artifacts(runs[0].info.run_id, "eval/per_class.json", str(dest))
    table = json.loads(open(local, encoding="utf-8").read())
    assert table["columns"][:2] == ["key", "label"] and len(table["data"]) == 3
    assert {row[0]: row[1] for row in table["data"]} == {key: label for label, key in KEYS.items()}


def test_the_readme_sweep_command_runs_as_written(project):
    dest, _ = project
    # README, "More": DVC writes lr as `3e-05`, which PyYAML alone reads as a string.
    exp = run(["dvc", "exp", "run", "-S", "train.lr=3e-5", "-S", "train.epochs=2"], dest)
    assert exp.returncode == 0
    assert "lr: 3e-05" in (dest / "params.yaml").read_text()
    client, runs = mlflow_runs(dest)
    assert len(runs) == 2
    params = runs[1].data.params
    assert params["train.lr"] == "3e-05" and params["train.epochs"] == "2"
    lrs = [m.value for m in client.get_metric_history(runs[1].info.run_id, "train/lr")]
    assert len(lrs) == 20  # 160 rows / 16 per step x 2 epochs
    assert max(lrs) == pytest.approx(3e-05, rel=0.1)  # linear decay from the 3e-05 peak

