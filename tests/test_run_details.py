"""The run's details (track/run_details.py): one JSON artifact for what a run records but nobody
filters runs by; the few decided values people do filter by stay tags."""

import mlflow

from wellfed.track import run_details, tracking


def test_sections_merge_key_by_key_and_the_searched_values_stay_tags(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "details", "r")
    assert run_details.read(uri, run_id) == {}  # a run made before details existed
    run_details.log_derived(uri, run_id, {"derived.world_size": 2, "derived.engine": "ray_train",
                                          "derived.accumulation_steps": 1},
                            {"versions": {"python": "3.11.7"}, "run_hash": "ab" * 32})
    # a resume on one worker, a worker's report, a later stage: each merges its own part
    run_details.log_derived(uri, run_id, {"derived.world_size": 1,
                                          "derived.accumulation_steps": 2})
    run_details.log_derived(uri, run_id, {"derived.precision": "fp32",
                                          "derived.precision_reason": "auto: CPU"})
    run_details.update(uri, run_id, {"calibration": "temperature 1.03 applied",
                                     "derived": {"model_source": "https://u:hunter2@host/m"}})
    details = run_details.read(uri, run_id)
    assert details == {"derived": {"accumulation_steps": 2, "precision_reason": "auto: CPU",
                                   "model_source": "<redacted>"},
                       "versions": {"python": "3.11.7"}, "run_hash": "ab" * 32,
                       "calibration": "temperature 1.03 applied"}
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    assert {k: v for k, v in tags.items() if not k.startswith("mlflow.")} == {
        "derived.world_size": "1", "derived.engine": "ray_train", "derived.precision": "fp32"}
    artifacts = [f.path for f in mlflow.MlflowClient(uri).list_artifacts(run_id)]
    assert artifacts == [run_details.ARTIFACT]  # one file, rewritten whole
