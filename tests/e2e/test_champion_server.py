"""The champion's races against a tracking server (`mlflow server`, REST), where no file lock of
the client's could reach: the same two-process races as tests/test_champion.py, through
http://. The server keeps its store in sqlite here; a PostgreSQL one behind it changes nothing
the client sees."""

from __future__ import annotations

import time

import mlflow
import pytest

from tests.e2e.pipeline import env
from tests.services import mlflow_served
from tests.test_champion import NAME, consistent, holder, promote, race

pytestmark = pytest.mark.e2e
PATIENCE = 300  # one-second tries for the server to answer (its first start makes the tables)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    with mlflow_served("server", ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                                  "--default-artifact-root", str(root / "artifacts"),
                                  "--workers", "2"], root, env(), PATIENCE) as uri:
        yield uri


@pytest.fixture()
def store(server):
    """A fresh registered model on the server, and a way to add versions of it."""
    client = mlflow.MlflowClient(server)
    experiment = client.create_experiment(f"demo-{time.time_ns()}")
    if client.search_registered_models(f"name = '{NAME}'"):  # the previous test's
        client.delete_registered_model(NAME)
    client.create_registered_model(NAME)

    def version() -> str:
        run_id = client.create_run(experiment).info.run_id
        return str(client.create_model_version(NAME, f"runs:/{run_id}/model",
                                               run_id=run_id).version)

    return server, client, version


def test_two_evaluations_released_together_through_the_server(store, tmp_path):
    uri, client, version = store
    base = version()
    promote(uri, base, 0.50)
    values = [(0.60, 0.70), (0.80, 0.75), (0.85, 0.90)]
    first, second = zip(*[(version(), version()) for _ in values])
    race(uri, tmp_path, ("plain", list(first), [a for a, _ in values]),
         ("plain", list(second), [b for _, b in values]))
    assert holder(client) == second[2]
    assert consistent(client)[second[2]].startswith("@champion: eval/macro_f1 0.9000")


def test_a_stale_read_that_writes_last_through_the_server(store, tmp_path):
    uri, client, version = store
    v1, v2, v3 = version(), version(), version()
    promote(uri, v1, 0.80)
    [stale], [fresh] = race(uri, tmp_path, ("stale", [v2], [0.85]), ("fresh", [v3], [0.90]))
    assert holder(client) == v3, (stale, fresh)
    assert stale.startswith(f"models:/{NAME}@champion is now version {v3}: version {v2} scored")
    consistent(client)
