"""Predict on a Ray cluster (Ray Data, one worker per node of a simulated 2-node cluster) writes
what predict in one process writes: the same rows, in the same order, the same labels, the same
scores to float precision; a request the cluster cannot place fails in one line. And the DVC
predict stage: absent by default, one `predict@<name>` stage per configured input."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tests.e2e.pipeline import env, make_project, run
from tests.test_serving import TEXTS, save_model
from wellfed.use.predict import predict_file

pytestmark = pytest.mark.e2e
ROWS = 60  # 9 chunks of 7 rows (the last one short): both workers get some


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    pair = save_model(tiny_model_dir, tmp_path_factory.mktemp("pair"), ["no", "yes"],
                      "single_label_classification",
                      {"task": "single_label", "text_columns": ["premise", "hypothesis"]})
    tags = save_model(tiny_model_dir, tmp_path_factory.mktemp("tags"), ["a", "b", "c"],
                      "multi_label_classification",
                      {"task": "multi_label", "text_columns": ["sentence"], "threshold": 0.4})
    return {"pair": pair, "tags": tags}


def predict_on(cluster, *args: str) -> subprocess.CompletedProcess:
    extra = {"RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": "disabled"}  # as test_cluster's
    return subprocess.run([sys.executable, "-m", "wellfed.use.predict_command", *args],
                          env={**env(), **extra}, capture_output=True, text=True, timeout=600)


def write_input(path, kind: str):
    texts = [TEXTS[i % len(TEXTS)] + f" {i}" for i in range(ROWS)]
    if kind == "pair":
        frame = pd.DataFrame({"premise": texts, "hypothesis": texts[::-1]})
    else:
        frame = pd.DataFrame({"sentence": texts})
    frame.to_csv(path, index=False)
    return path


@pytest.mark.slow  # ~30 s each here: a model load per Ray worker, on 2 shared cores
@pytest.mark.parametrize("kind", ["pair", "tags"])
def test_two_workers_on_two_nodes_write_what_one_process_writes(cluster, models, tmp_path, kind):
    source = write_input(tmp_path / "new.csv", kind)
    single, spread = tmp_path / "one.parquet", tmp_path / "ray.parquet"
    assert predict_file(models[kind], source, single, chunk_rows=7) == ROWS
    proc = predict_on(cluster, str(models[kind]), str(source), str(spread), "--workers", "2",
                      "--chunk-rows", "7")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ray: " in proc.stderr and "2 node(s), 2 CPUs, 0 GPUs" in proc.stderr
    assert "SIGABRT" not in proc.stderr and "execution finished" not in proc.stderr
    assert f"predict: {ROWS} rows of {source} -> {spread} on 2 Ray worker(s)" in proc.stdout
    one, two = pd.read_parquet(single), pd.read_parquet(spread)
    assert list(two.columns) == list(one.columns)
    assert two["row"].tolist() == one["row"].tolist() == list(range(ROWS))
    probs = [c for c in one.columns if c.startswith("prob_")]
    assert len(probs) == (2 if kind == "pair" else 3)
    np.testing.assert_allclose(two[probs].to_numpy(), one[probs].to_numpy(), rtol=1e-5, atol=1e-6)
    if kind == "pair":
        assert two["label"].tolist() == one["label"].tolist()
        np.testing.assert_allclose(two["score"], one["score"], rtol=1e-5, atol=1e-6)
    else:
        assert [list(x) for x in two["labels"]] == [list(x) for x in one["labels"]]


def test_more_workers_than_the_cluster_can_place_is_one_line_and_no_output(cluster, models,
                                                                           tmp_path):
    source = write_input(tmp_path / "new.csv", "pair")
    out = tmp_path / "ray.parquet"
    proc = predict_on(cluster, str(models["pair"]), str(source), str(out), "--workers", "3")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("error: 3 predict workers with 1 CPU each do not fit this cluster (2 node(s), "
                    "2 CPUs, 0 GPUs: room for 2); lower --workers (predict.workers) or add nodes")
    assert not out.exists() and not list(tmp_path.glob(".ray*"))


def test_the_dvc_predict_stage_is_absent_by_default_and_tracks_a_configured_input(models,
                                                                                   tmp_path):
    (tmp_path / "p").mkdir()
    project = make_project(tmp_path / "p", {})
    stages = run(["dvc", "stage", "list", "--name-only"], project).stdout.split()
    assert stages == ["check", "prepare", "tokenize", "train", "evaluate"]  # no predict stage
    shutil.copytree(models["pair"], project / "data" / "model")  # as the train stage leaves it
    source = write_input(project / "data" / "new.csv", "pair")
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("  inputs: {}\n",
                                                 "  inputs:\n    pairs: data/new.csv\n"))
    stages = run(["dvc", "stage", "list", "--name-only"], project).stdout.split()
    assert stages == ["check", "prepare", "tokenize", "train", "evaluate", "predict@pairs"]
    proc = run(["dvc", "repro", "--single-item", "predict@pairs"], project)
    assert f"predict: {ROWS} rows of data/new.csv -> data/predictions/pairs.parquet" in proc.stdout
    written = pd.read_parquet(project / "data" / "predictions" / "pairs.parquet")
    assert predict_file(models["pair"], source, tmp_path / "direct.parquet") == ROWS
    pd.testing.assert_frame_equal(written, pd.read_parquet(tmp_path / "direct.parquet"))
    assert "predict@pairs" not in run(["dvc", "status", "predict@pairs"], project).stdout
    with open(source, "a", encoding="utf-8") as f:
        f.write("one more,row\n")
    status = run(["dvc", "status", "predict@pairs"], project).stdout
    assert "predict@pairs" in status and "modified:           data/new.csv" in status
