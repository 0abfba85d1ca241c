import mlflow

from wellfed import tracking


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
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.tracking_uri("", tmp_path) == "http://127.0.0.1:5000"
