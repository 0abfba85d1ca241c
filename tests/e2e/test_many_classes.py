"""A 77-class run (Banking77's class count) through `dvc repro`, tiny random-init BERT on one
CPU worker: the run's metric keys stay few whatever the class count, the per-class figures are
one table, derived values are tags, and the run's description holds the headline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import write_tsv
from tests.e2e.pipeline import make_project, mlflow_runs, run

pytestmark = pytest.mark.e2e

CLASSES = [f"intent {i:02d}" for i in range(74)] + ["card/lost", "refund?", "naïve café"]
WORDS = "card pay refund lost account balance top up fee transfer cash pin limit".split()


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir):
    dest = tmp_path_factory.mktemp("classes77")
    make_project(dest, {"model": {"name": str(tiny_model_dir), "init": "random"},
                        "train": {"epochs": 1, "global_batch_size": 32, "micro_batch_size": 32,
                                  "eval_every": 0, "report_every": 5, "checkpoint_every": 0},
                        "ray": {"num_workers": 1, "cpus_per_worker": 1}},
                 {"train.tsv": 1, "dev.tsv": 1, "test.tsv": 1})
    rng = np.random.default_rng(0)
    for name, per_class in (("train.tsv", 4), ("dev.tsv", 1), ("test.tsv", 2)):
        rows = [(" ".join(rng.choice(WORDS, size=6)) + f" {label} {i}", label)
                for label in CLASSES for i in range(per_class)]
        write_tsv(dest / "data" / "raw" / name, rows)
    run(["git", "add", "-A"], dest)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "77"], dest)
    run(["dvc", "repro"], dest)
    _, runs = mlflow_runs(dest)
    assert len(runs) == 1
    return dest, runs[0]


def test_few_metric_keys_whatever_the_class_count(project):
    _, run_ = project
    ours = sorted(run_.data.metrics)
    assert len(ours) <= 30, ours  # 30: see docs/mlflow.md, "metrics"
    assert not [k for k in ours if k.startswith("system/")]  # in-process: the worker's sampler
    assert [k for k in ours if k.startswith("eval/")] == ["eval/accuracy", "eval/ece",
                                                          "eval/macro_f1"]
    assert not [k for k in ours if k.startswith("worker0/")]  # one worker: its figures are means
    assert sorted(ours, key=lambda k: k.startswith("workers/")) == ours  # headline sorts first


def test_the_per_class_figures_are_one_table_with_the_label_text(project):
    dest, run_ = project
    client, _ = mlflow_runs(dest)
    listed = [a.path for a in client.list_artifacts(run_.info.run_id, "eval")]
    assert [p for p in listed if "per_class" in p or "label_keys" in p] == ["eval/per_class.json"]
    table = json.loads(open(client.download_artifacts(run_.info.run_id, "eval/per_class.json",
                                                      str(dest)), encoding="utf-8").read())
    assert table["columns"] == ["key", "label", "precision", "recall", "f1", "support"]
    assert sorted(row[1] for row in table["data"]) == sorted(CLASSES)
    assert sum(row[5] for row in table["data"]) == 77 * 2  # every test row, once
    logged = json.loads(run_.data.tags["mlflow.loggedArtifacts"])  # the UI shows it as a table
    assert {"path": "eval/per_class.json", "type": "table"} in logged


def test_derived_values_are_tags_and_the_note_holds_the_headline(project):
    _, run_ = project
    assert not [k for k in run_.data.params if k.startswith("derived.")]
    assert run_.data.tags["derived.precision"] == "fp32" and "wellfed.run_key" in run_.data.tags
    m, note = run_.data.metrics, run_.data.tags["mlflow.note.content"]
    for words in (f"**eval/macro_f1 {m['eval/macro_f1']:.4f}**", f"eval/accuracy {m['eval/accuracy']:.4f}",
                  "on test (154 rows)", "single_label, 77 classes", "train 308, validation 77",
                  f"{m['train/real_tokens_per_s']:,.0f} real tokens/s", f"MFU {m['train/mfu']:.1%}",
                  f"padding efficiency {m['train/padding_efficiency']:.1%}", "Bottleneck:",
                  "models:/wellfed-classifier/1", "eval/per_class.json"):
        assert words in note, (words, note)
