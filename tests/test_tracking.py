import mlflow
import pytest

from wellfed.track import tracking, worker_metrics


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    """One sqlite store for the tests below (creating one costs ~3 s); each uses its own experiment."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


def test_secrets_never_reach_mlflow(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_" + "a" * 30)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "secrets", "r")
    params = {"train.lr": 1e-4, "hf_token": "hf_" + "b" * 30, "AWS_SECRET_ACCESS_KEY": "x" * 40,
              "mlflow.tracking_uri": "https://user:hunter2@mlflow.example.com",
              "model.name": "ghp_" + "c" * 30, "MLFLOW_TRACKING_PASSWORD": "pw"}
    tags = {"git.commit": "abc", "api_key": "k", "note": "AKIA" + "D" * 16}
    tracking.log_params(uri, run_id, params, tags)
    run = mlflow.MlflowClient(uri).get_run(run_id)
    stored = str(run.data.params) + str(run.data.tags)
    for secret in ("hf_", "x" * 40, "hunter2", "ghp_", "pw'", "AKIA", "'k'"):
        assert secret not in stored, secret
    assert run.data.params["train.lr"] == "0.0001"
    assert run.data.params["model.name"] == "<redacted>" and run.data.tags["git.commit"] == "abc"


def test_tracking_uri_is_absolute_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert tracking.tracking_uri("", tmp_path) == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    # A queued dvc experiment runs in <project>/.dvc/tmp/exps/<name>: the project's store.
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / ".dvc" / "tmp" / "exps" / "tmpa1b2"))
    assert tracking.tracking_uri("", tmp_path / "elsewhere") == \
        f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.tracking_uri("", tmp_path) == "http://127.0.0.1:5000"


def test_experiment_opens_in_the_model_training_view(uri):
    """MLflow 3's UI reads mlflow.experimentKind: custom_model_development is "Machine learning"."""
    client = mlflow.MlflowClient(uri)
    tracking.start_run(uri, "fresh", "r")
    assert client.get_experiment_by_name("fresh").tags["mlflow.experimentKind"] == \
        "custom_model_development"
    old = client.create_experiment("old")  # made before wellfed set the tag
    mine = client.create_experiment("mine", tags={"mlflow.experimentKind": "finetuning"})
    tracking.start_run(uri, "old", "r")
    tracking.start_run(uri, "mine", "r")
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
    assert client.get_experiment(mine).tags["mlflow.experimentKind"] == "finetuning"  # kept


def test_a_repeated_run_name_is_numbered_and_a_resume_keeps_its_run(uri):
    client = mlflow.MlflowClient(uri)
    tags = {"wellfed.run_key": "wf-0123456789ab"}
    ids = [tracking.start_run(uri, "e", "minilm-lr1e-4-b32-3f2a", tags=tags) for _ in range(3)]
    names = [client.get_run(i).info.run_name for i in ids]
    assert names == ["minilm-lr1e-4-b32-3f2a", "minilm-lr1e-4-b32-3f2a-2",
                     "minilm-lr1e-4-b32-3f2a-3"]
    assert client.get_run(ids[0]).data.tags["wellfed.run_key"] == "wf-0123456789ab"
    assert tracking.start_run(uri, "e", "other", run_id=ids[1]) == ids[1]  # resume: same run
    assert client.get_run(ids[1]).info.run_name == "minilm-lr1e-4-b32-3f2a-2"


def test_run_level_figures_are_logged_once_whatever_the_reruns(uri):
    """Evaluate killed after logging its figures and rerun (the same model: the same figures)
    logged eval/* twice at step 0; now a figure the run already has is not logged again, and
    one that changed is, the run showing the newer."""
    client = mlflow.MlflowClient(uri)
    run_id = tracking.start_run(uri, "once", "evaluated")
    figures = {"eval/macro_f1": 0.8125, "eval/accuracy": 0.8, "eval/ece": float("nan")}
    for _ in range(3):
        tracking.log_metrics(uri, run_id, figures)
    histories = {k: client.get_metric_history(run_id, k) for k in figures}
    assert len(histories) == 3
    assert all(len(h) == 1 and h[0].step == 0 for h in histories.values()), histories
    tracking.log_metrics(uri, run_id, {**figures, "eval/accuracy": 0.85})
    assert [m.value for m in client.get_metric_history(run_id, "eval/accuracy")] == [0.8, 0.85]
    assert client.get_run(run_id).data.metrics["eval/accuracy"] == 0.85
    assert len(client.get_metric_history(run_id, "eval/macro_f1")) == 1


def test_run_title_and_key(monkeypatch):
    from wellfed.config import ModelConfig, TrainConfig
    from wellfed.train.run import runs

    train, model = TrainConfig(lr=1e-4, global_batch_size=32), ModelConfig()
    digest = runs.run_hash(train, model, "d" * 64)
    assert runs.run_name(train, model, "d" * 64) == "wf-" + digest[:12]  # the Ray key, unchanged
    assert runs.run_title(train, model, digest) == f"minilm-lr1e-4-b32-{digest[:4]}"
    hub = ModelConfig(name="distilbert/distilbert-base-uncased")
    assert runs.run_title(TrainConfig(lr=2.5e-5, global_batch_size=256), hub, digest) == \
        f"distilbert-base-uncased-lr2.5e-5-b256-{digest[:4]}"


def test_token_files_are_the_runs_dataset_inputs(tmp_path, uri):
    import hashlib
    import json

    import pyarrow as pa

    for split, rows in (("train", 5), ("validation", 2)):  # no test split: two inputs
        table = pa.table({"input_ids": [[101, 7, 102]] * rows, "label": [0] * rows})
        with pa.OSFile(str(tmp_path / f"{split}.arrow"), "wb") as sink, \
                pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    run_id = tracking.start_run(uri, "data", "r")
    assert tracking.log_datasets(uri, run_id, tmp_path) == 2
    inputs = mlflow.MlflowClient(uri).get_run(run_id).inputs.dataset_inputs
    assert len(inputs) == 2
    by_name = {i.dataset.name: i for i in inputs}
    train = by_name["tokens/train"].dataset
    sha = hashlib.sha256((tmp_path / "train.arrow").read_bytes()).hexdigest()
    assert train.digest == sha[:36] and json.loads(train.profile) == {"num_rows": 5, "sha256": sha}
    assert json.loads(train.source)["uri"] == str((tmp_path / "train.arrow").resolve())
    assert [t.value for t in by_name["tokens/validation"].tags] == ["validation"]


def test_worker_choices_are_details_or_tags_and_a_report_may_carry_more(uri, capsys):
    """What the workers decided (precision, devices, ... and any key of a report's `derived`)
    is not params: the precision and the devices, which runs are compared by, are tags, the
    rest (and any key of a report's `derived`) the run's details; one worker logs no per-worker
    metric keys; rank 0's time per part of the loop is one tag the stage's breakdown reads."""
    import json

    from wellfed.track import run_details
    from wellfed.train.outputs.callback import MlflowCallback

    run_id = tracking.start_run(uri, "choices", "r")
    records = [{"step": s, "epoch": 0, "lr": 1e-4, "loss": 1.0, "grad_norm": 1.0, "rows": 8,
                "real_tokens": 80, "padded_tokens": 96} for s in (1, 2)]
    rep = {"rank": 0, "records": records, "steps_total": 2, "interval_s": 1.0,
           "input_wait_s": 0.01, "copy_s": 0.0, "compute_s": 0.99, "local_rows": 8,
           "local_real_tokens": 80, "mfu": 0.1, "telemetry": {"cpu_util_pct": 99.0},
           "sampler": "cpu", "precision": "fp32", "precision_reason": "CPU", "pad_multiple": 1,
           "device": "cpu", "node": "n0", "peak_flops": 1e12, "peak_source": "table",
           "derived": {"attention": "sdpa"}, "timing": {"setup": 2.0, "steps": 1.0}}
    MlflowCallback(uri, run_id, "unused-backlog").after_report(None, [rep], None)
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.data.params == {}
    tags = run.data.tags
    assert tags["derived.precision"] == "fp32" and tags["derived.devices"] == "cpu"
    assert not {"derived.attention", "derived.precision_reason", "derived.peak_flops"} & set(tags)
    derived = run_details.read(uri, run_id)["derived"]
    assert derived["attention"] == "sdpa" and derived["precision_reason"] == "CPU"
    assert derived["peak_flops"] == "1e+12" and derived["worker_nodes"] == 1
    assert json.loads(tags[worker_metrics.WORKER_TIME])["seconds"] == {"setup": 2.0, "steps": 1.0}
    assert not [k for k in run.data.metrics if k.startswith("worker0")]
    assert run.data.metrics["workers/cpu_util_pct_mean"] == 99.0
    assert "[wellfed] precision=fp32 (CPU), pad_multiple=1" in capsys.readouterr().out


def test_the_cuda_graph_steps_counts_are_metrics_only_when_graphs_ran():
    records = [{"step": 1, "epoch": 0, "rows": 8, "real_tokens": 80, "padded_tokens": 96}]
    rep = {"rank": 0, "records": records, "interval_s": 1.0, "input_wait_s": 0.0, "copy_s": 0.0,
           "compute_s": 1.0, "local_rows": 8, "local_real_tokens": 80, "mfu": 0.1}
    assert not [k for k in worker_metrics.interval_metrics([rep]) if "graph" in k]
    graphed = worker_metrics.interval_metrics([{**rep, "graphs_captured": 17, "graph_capture_s": 0.8}])
    assert graphed["workers/graphs_captured"] == 17 and graphed["workers/graph_capture_s"] == 0.8


WRITER = """
import pathlib, sys, time
from mlflow.entities import Metric
from wellfed.track import tracking
uri, name, ready = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
(ready / name).touch()  # imported; every writer opens the fresh store once all four are here
while len(list(ready.iterdir())) < 4:
    time.sleep(0.01)
run_id = tracking.start_run(uri, "sweep", name)
for step in range(60):
    now = int(time.time() * 1000)
    tracking.send_metrics(uri, run_id, [Metric(f"train/k{j}", float(step), now, step)
                                        for j in range(20)])
print(run_id)
"""


@pytest.mark.integration
def test_four_trials_open_and_fill_a_fresh_store_at_once_and_lose_nothing(tmp_path):
    """A sweep's first trials on a fresh sqlite store: MLflow creates its tables on first use,
    and four processes doing that at once failed (store_lock). Then every metric lands."""
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ready = tmp_path / "ready"  # a barrier: after all four have imported MLflow, however long
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, uri, f"trial-{i}", str(ready)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in results]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    assert sorted(r.info.run_name for r in runs) == [f"trial-{i}" for i in range(4)]
    for run in runs:
        assert len(run.data.metrics) == 20
        assert len(client.get_metric_history(run.info.run_id, "train/k7")) == 60
