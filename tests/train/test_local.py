"""When the train stage trains in its own process (train/run/local.py) and when on Ray Train."""

import pytest

from wellfed.config import load_section
from wellfed.train.run import preflight


@pytest.mark.parametrize("ray, env, expected", [
    ({}, {}, True),  # the default: one worker, no cluster
    ({"num_workers": 2}, {}, False),  # DDP needs Ray's worker group
    ({"address": "ray-head:6379"}, {}, False),  # a cluster to join
    ({}, {"RAY_ADDRESS": "ray-head:6379"}, False),  # the sbatch script's way of naming it
    ({"in_process": False}, {}, False),  # YAML's false: always Ray Train
])
def test_one_local_worker_trains_in_process_unless_told_otherwise(ray, env, expected,
                                                                  monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert preflight.in_process(load_section({"ray": ray}, "ray")) is expected


def test_in_process_takes_auto_or_false_only():
    with pytest.raises(ValueError, match="ray.in_process"):
        load_section({"ray": {"in_process": "yes"}}, "ray")
