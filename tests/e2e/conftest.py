"""Fixtures of the e2e tier's team store tests (test_team.py, test_team_checks.py): one team
store and one tokenized project for both, started on first use and stopped at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.pipeline import make_project, run
from tests.e2e.teamstore import team_store


@pytest.fixture(scope="session")
def store():
    with team_store() as started:
        yield started


@pytest.fixture(scope="session")
def tokenized(store, tmp_path_factory, tiny_model_dir) -> Path:
    """A project whose tokens are made and committed (a sweep's trials find them), recording
    into the team store: its small recipe is test_team.py's sweep."""
    project = tmp_path_factory.mktemp("team")
    make_project(project, {"model": {"name": str(tiny_model_dir), "init": "random"},
                           "train": {"epochs": 4, "global_batch_size": 16,
                                     "micro_batch_size": 16, "report_every": 4,
                                     "checkpoint_every": 8, "eval_every": 0},
                           "ray": {"num_workers": 1, "cpus_per_worker": 1},
                           "mlflow": {"tracking_uri": store.uri}},
                 {"train.tsv": 300, "dev.tsv": 60, "test.tsv": 60})
    run(["dvc", "repro", "tokenize"], project)
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "tokens"],
        project)
    return project
