"""`dvc repro` end to end: tiny random-init BERT, 2 Ray workers on CPU, real DVC and MLflow."""

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import own_wellfed
from tests.e2e.pipeline import details, make_project, mlflow_runs, run

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir):
    dest = tmp_path_factory.mktemp("pipeline")
    params = {"model": {"name": str(tiny_model_dir), "init": "random"},
              "train": {"epochs": 3, "lr": 2e-3, "global_batch_size": 16, "micro_batch_size": 4,
                        "eval_every": 20, "report_every": 5, "checkpoint_every": 20,
                        "profile_steps": "3-4"},
              "ray": {"num_workers": 2, "cpus_per_worker": 1}}
    make_project(dest, params)
    proc = run(["dvc", "repro"], dest)
    return dest, proc


def test_repro_writes_every_output(project):
    dest, proc = project
    assert (dest / "dvc.lock").is_file()
    for path in ("data/prepared/train.parquet", "data/tokens/train.arrow", "data/model/config.json",
                 "data/train/metrics.json", "data/train/history/steps.csv",
                 "data/eval/predictions.parquet", "data/eval/confusion.png"):
        assert (dest / path).is_file(), path
    assert "[wellfed] step" in proc.stdout + proc.stderr  # the driver-side progress line
    assert "Reporting training result" not in proc.stdout + proc.stderr


def test_model_directory_loads_in_a_transformers_pipeline(project):
    from transformers import pipeline

    dest, _ = project
    clf = pipeline("text-classification", model=str(dest / "data" / "model"))
    out = clf(["the film was wonderful .", "the app was broken ."])
    assert len(out) == 2
    assert {o["label"] for o in out} <= {"negative", "neutral", "positive"}


def test_metrics_and_predictions(project):
    dest, _ = project
    metrics = json.loads((dest / "data/eval/report.json").read_text())
    assert metrics["split"] == "test" and metrics["rows"] == 150
    assert 0 <= metrics["accuracy"] <= 1 and 0 <= metrics["macro_f1"] <= 1
    assert set(metrics["per_class"]) == {"negative", "neutral", "positive"}
    headline = json.loads((dest / "data/eval/metrics.json").read_text())
    assert headline == {"eval/accuracy": metrics["accuracy"], "eval/macro_f1": metrics["macro_f1"],
                        "eval/ece": metrics["ece"]}
    preds = pd.read_parquet(dest / "data/eval/predictions.parquet")
    assert preds["row_id"].tolist() == list(range(150))  # original file order
    gold = pd.read_csv(dest / "data/raw/test.tsv", sep="\t")["label"].tolist()
    assert preds["gold"].tolist() == gold
    train = json.loads((dest / "data/train/metrics.json").read_text())
    assert train["train/rows"] == 3 * 600
    steps = pd.read_csv(dest / "data/train/history/steps.csv")["step"].tolist()
    assert steps == list(range(1, 115))  # 600 rows / 16 per step = 38 steps per epoch, 3 epochs


def test_mlflow_run_has_params_losses_validation_and_eval(project):
    dest, _ = project
    client, runs = mlflow_runs(dest)
    assert len(runs) == 1
    run_ = runs[0]
    params = run_.data.params
    assert params["train.lr"] == "0.002" and run_.data.tags["derived.world_size"] == "2"
    assert not [k for k in params if k.startswith("derived.")]  # tags: not the user's knobs
    assert params["prepare.text_column"] == "sentence"  # every params.yaml value
    assert len(run_.data.tags["mlflow.source.git.commit"]) == 40
    assert details(dest, run_)["versions"]["python"].startswith("3.")
    loss = [m.value for m in client.get_metric_history(run_.info.run_id, "train/loss")]
    steps = [m.step for m in client.get_metric_history(run_.info.run_id, "train/loss")]
    assert steps == list(range(1, 115))  # one value per step, in order
    assert sum(loss[-10:]) / 10 < sum(loss[:10]) / 10 - 0.1  # it learned
    assert len(client.get_metric_history(run_.info.run_id, "val/accuracy")) == 6  # 5 evals + final
    for key in ("eval/accuracy", "eval/macro_f1", "workers/samples_per_s", "workers/padding_efficiency",
                "worker0/input_wait_share", "worker1/input_wait_share"):
        assert key in run_.data.metrics, key
    artifacts = {a.path for a in client.list_artifacts(run_.info.run_id)}
    assert {"eval", "plots", "profile", "diagnosis.md"} <= artifacts
    profile = {a.path for a in client.list_artifacts(run_.info.run_id, "profile")}
    assert {"profile/trace_steps_3-4.json", "profile/top_operators.txt"} == profile


def test_mlflow_shows_a_named_run_its_datasets_and_its_registered_model(project):
    import mlflow

    dest, proc = project
    client, runs = mlflow_runs(dest)
    run_ = runs[0]
    key, digest = run_.data.tags["wellfed.run_key"], details(dest, run_)["run_hash"]
    assert key == "wf-" + digest[:12]  # the Ray folder
    model_dir = Path(run_.data.params["model.name"]).name  # tiny-bert0: a local model directory
    assert run_.info.run_name == f"{model_dir}-lr2e-3-b16-{digest[:4]}"
    exp = client.get_experiment(run_.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    inputs = {i.dataset.name: i.dataset for i in run_.inputs.dataset_inputs}
    assert sorted(inputs) == ["tokens/test", "tokens/train", "tokens/validation"]
    assert json.loads(inputs["tokens/test"].profile)["num_rows"] == 150
    version = client.get_model_version("wellfed-classifier", "1")
    assert version.run_id == run_.info.run_id
    assert "[wellfed] model registered: models:/wellfed-classifier/1" in proc.stdout
    mlflow.set_tracking_uri(f"sqlite:///{dest / 'mlflow.db'}")
    with own_wellfed():
        model = mlflow.pyfunc.load_model("models:/wellfed-classifier/1")
        out = model.predict(pd.DataFrame({"sentence": ["the app was broken .", "wonderful !"]}))
    assert out["label"].isin(["negative", "neutral", "positive"]).all() and len(out) == 2


def test_telemetry_keys_have_sane_values_for_every_worker(project):
    dest, _ = project
    client, runs = mlflow_runs(dest)
    run_id = runs[0].info.run_id
    history = {k: [m.value for m in client.get_metric_history(run_id, k)]
               for k in runs[0].data.metrics}
    for rank in (0, 1):
        waits = history[f"worker{rank}/input_wait_share"]
        assert len(waits) == len(history["workers/samples_per_s"]) > 5  # one value per interval
        assert all(0 <= w <= 1 for w in waits)
        assert all(m > 0 for m in history[f"worker{rank}/mfu"])
        assert all(u >= 0 for u in history[f"worker{rank}/cpu_util_pct"])
    assert all(0 < p <= 1 for p in history["workers/padding_efficiency"])
    tags, derived = runs[0].data.tags, details(dest, runs[0])["derived"]
    assert tags["derived.precision"] == "fp32" and "CPU" in derived["precision_reason"]
    assert derived["peak_source"].startswith("estimate:") and derived["telemetry"] == "cpu"
    assert any(k.startswith("system/") for k in runs[0].data.metrics)  # MLflow system metrics
    diagnosis = (dest / "data/train/speed/diagnosis.md").read_text()
    assert "Bottleneck:" in diagnosis and "input-bound" not in diagnosis
    steps = [m.step for m in client.get_metric_history(run_id, "train/loss")]
    assert steps == sorted(set(steps))  # strictly increasing, no repeats


def test_second_repro_does_nothing_and_an_experiment_is_a_new_run(project):
    dest, _ = project
    again = run(["dvc", "repro"], dest)
    assert "Data and pipelines are up to date" in again.stdout
    # one worker: trained in the stage's own process, no second Ray Train start (~40 s)
    exp = run(["dvc", "exp", "run", "-S", "train.lr=0.001", "-S", "train.epochs=1",
               "-S", "ray.num_workers=1"], dest)
    assert exp.returncode == 0
    client, runs = mlflow_runs(dest)
    assert len(runs) == 2
    assert runs[1].data.params["train.lr"] == "0.001"
    assert runs[1].data.tags.get("dvc.exp_name")
    assert runs[1].info.run_name == runs[1].data.tags["dvc.exp_name"]  # DVC's name, in MLflow
    assert client.get_model_version("wellfed-classifier", "2").run_id == runs[1].info.run_id


def test_a_params_typo_fails_before_any_stage_even_on_an_up_to_date_pipeline(project):
    """The check stage (dvc.yaml) reads the whole params.yaml whenever it changes, and runs
    first: a key no stage reads, added by `-S +...` or by hand, stops `dvc exp run` and
    `dvc repro` with one line, though no other stage would have run."""
    dest, _ = project
    params = dest / "params.yaml"
    before, runs_before = params.read_text(), len(mlflow_runs(dest)[1])
    try:
        exp = run(["dvc", "exp", "run", "-S", "+ray.num_worker=2"], dest, check=False)
        out = exp.stdout + exp.stderr
        assert exp.returncode != 0, out[-3000:]
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert errors == ["error: params.yaml: unknown key 'ray.num_worker' (did you mean "
                          "'ray.num_workers'?)"], out[-3000:]
        assert "Running stage 'check'" in out and "Running stage 'prepare'" not in out
        params.write_text(before.replace("train:\n", "trian:\n  lr: 0.1\ntrain:\n", 1))
        again = run(["dvc", "repro"], dest, check=False)
        assert again.returncode != 0
        assert "error: params.yaml: unknown section 'trian' (did you mean 'train'?)" in again.stderr
    finally:
        params.write_text(before)
    assert len(mlflow_runs(dest)[1]) == runs_before  # nothing trained
    assert "Data and pipelines are up to date" in run(["dvc", "status"], dest).stdout


def test_editing_a_module_evaluate_imports_marks_evaluate_changed(project):
    """dvc.yaml's deps are true (tests/test_pipeline_deps.py): a change to batching.py, which
    evaluate imports through the token-file gather, makes `dvc status` call evaluate changed."""
    dest, _ = project
    module = dest / "src" / "wellfed" / "data" / "batching.py"
    original = module.read_text()
    try:
        module.write_text(original + "\n# touched\n")
        out = run(["dvc", "status", "evaluate"], dest).stdout
        assert "evaluate:" in out and "modified:" in out and "src/wellfed/data/batching.py" in out
    finally:
        module.write_text(original)


def test_without_a_test_split_evaluate_scores_the_exported_models_validation_outputs(
        tmp_path, tiny_model_dir):
    """No test split: evaluate scores validation with the outputs the train stage computed for
    the exported (calibrated) model from the chosen checkpoint's validation logits: no model
    loaded and no split predicted a third time. They are what predicting again gives."""
    import numpy as np
    import torch

    from wellfed import device as dev
    from wellfed.data.token_files import TokenFile
    from wellfed.evaluate.predictions import load_exported, predict

    make_project(tmp_path, {"model": {"name": str(tiny_model_dir), "init": "random"},
                            "prepare": {"test": ""},
                            "train": {"epochs": 2, "lr": 2e-3, "global_batch_size": 16,
                                      "micro_batch_size": 8, "eval_every": 10,
                                      "report_every": 5, "calibrate": "temperature"}},
                 {"train.tsv": 160, "dev.tsv": 60})
    run(["dvc", "repro"], tmp_path)
    evaluate = json.loads((tmp_path / "data/reports/time/evaluate.json").read_text())
    assert not {"model load", "predict"} & set(evaluate["parts_s"]), evaluate["parts_s"]
    report = json.loads((tmp_path / "data/eval/report.json").read_text())
    assert report["split"] == "validation" and report["rows"] == 60
    data = TokenFile(tmp_path / "data/tokens/validation.arrow")
    cpu = torch.device("cpu")
    again = predict(load_exported(tmp_path / "data/model"), data, 0, cpu,
                    dev.choose_precision("auto", cpu))
    frame = pd.read_parquet(tmp_path / "data/eval/predictions.parquet")
    np.testing.assert_allclose(frame[[c for c in frame if c.startswith("prob_")]].to_numpy(),
                               again, atol=1e-5)
    assert json.loads((tmp_path / "data/model/wellfed.json").read_text())["calibration"][
        "method"] == "temperature"
