"""What the driver does after Ray Train gave up on a lost node (train/run/lost_node.py): the
cluster as Ray reports it is faked, the MLflow run is real (sqlite). The real two-raylet case,
shrink, is tests/e2e/test_lost_node.py."""

from __future__ import annotations

import mlflow
import pytest

from wellfed.config import RayConfig, TrainConfig
from wellfed.track import run_details, tracking
from wellfed.train.run import lost_node
from wellfed.train.run.failures import TrainingFailed

ONE_NODE = [{"CPU": 1.0, "memory": 1e9}]
PER_WORKER = {"CPU": 1}


@pytest.fixture
def run(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "lost", "r", tags={"derived.world_size": "2"})
    monkeypatch.setattr(lost_node.cluster, "live_nodes", lambda: ONE_NODE)
    return uri, run_id


def test_the_workers_that_fit_go_on_with_the_same_global_batch(run, capsys):
    uri, run_id = run
    asked = RayConfig(num_workers=2, cpus_per_worker=1, max_failures=1)
    train = TrainConfig(global_batch_size=16, micro_batch_size=8)
    shrunk = lost_node.after_ray_train(asked, asked, PER_WORKER, train, 40, uri, run_id)
    assert shrunk.num_workers == 1 and shrunk.cpus_per_worker == 1
    line = capsys.readouterr().out.strip()
    assert line == (
        "[wellfed] a node was lost: the cluster has 1 node(s), 1 CPUs, 0 GPUs now, room for 1 of "
        "the run's 2 worker(s), after Ray's restarts (ray.max_failures: 1); the checkpoint of "
        "step 40 is kept; continuing on 1 worker(s) from step 40, the same global batch of 16 "
        "rows (2 micro-batch(es) per worker per step), into the same MLflow run "
        "(ray.on_lost_node: shrink)")
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    assert tags["derived.world_size"] == "1" and tags["derived.world_sizes"] == "2,1"
    assert run_details.read(uri, run_id)["derived"]["accumulation_steps"] == 2  # not a tag
    assert "derived.accumulation_steps" not in tags
    assert tags[lost_node.LOST_TAG] == line.removeprefix("[wellfed] ")


def test_stop_says_what_to_run_and_marks_the_run(run, capsys):
    uri, run_id = run
    asked = RayConfig(num_workers=2, cpus_per_worker=1, max_failures=2, on_lost_node="stop")
    with pytest.raises(TrainingFailed) as stop:
        lost_node.after_ray_train(asked, asked, PER_WORKER, TrainConfig(), 40, uri, run_id)
    assert str(stop.value).endswith(
        "(ray.on_lost_node: stop); rerun with `dvc exp run -S ray.num_workers=1` (or set "
        "ray.num_workers: 1 in params.yaml and `dvc repro`) to resume on the workers that fit, "
        "the same global batch, into the same MLflow run; or add a node and rerun `dvc repro`")
    assert "the checkpoint of step 40 is kept" in str(stop.value)
    assert capsys.readouterr().out == ""  # the stage prints the error line, once
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    assert tags[lost_node.LOST_TAG] == str(stop.value) and tags["derived.world_size"] == "2"


def test_no_room_for_one_worker_stops_even_when_asked_to_shrink(run, monkeypatch):
    uri, run_id = run
    monkeypatch.setattr(lost_node.cluster, "live_nodes", lambda: [{"CPU": 4.0}])  # no GPU left
    asked = RayConfig(num_workers=2, cpus_per_worker=1)
    with pytest.raises(TrainingFailed, match="room for 0 of the run's 2 worker.*add a node"):
        lost_node.after_ray_train(asked, asked, {"CPU": 1, "GPU": 1}, TrainConfig(), None, uri,
                                  run_id)


def test_a_failure_with_room_left_is_not_a_lost_node(run):
    uri, run_id = run
    asked = RayConfig(num_workers=1, cpus_per_worker=1)
    assert lost_node.after_ray_train(asked, asked, PER_WORKER, TrainConfig(), 40, uri,
                                     run_id) is None
    assert lost_node.LOST_TAG not in mlflow.MlflowClient(uri).get_run(run_id).data.tags


def test_a_placed_trial_is_sent_again_only_for_a_lost_node_or_process():
    import ray.exceptions

    assert lost_node.node_lost(ray.exceptions.NodeDiedError("the node died"))
    assert lost_node.node_lost(ray.exceptions.WorkerCrashedError())
    assert not lost_node.node_lost(ValueError("the trial's own error"))
    line = lost_node.resend_line("run wf-1", 1, 2, 16, ray.exceptions.WorkerCrashedError())
    assert line == ("run wf-1: its node or process was lost (WorkerCrashedError); sending it "
                    "again from the checkpoint of step 16 (restart 1 of ray.max_failures: 2), "
                    "into the same MLflow run, where Ray has room")
    given_up = lost_node.placed_given_up("run wf-1", 2, None, ray.exceptions.WorkerCrashedError())
    assert "3 time(s), more than ray.max_failures: 2 restarts; no checkpoint yet" in str(given_up)


def test_strict_spread_counts_one_worker_per_node():
    nodes = [{"CPU": 4.0}, {"CPU": 4.0}]
    assert lost_node.room_left(nodes, PER_WORKER, 3) is None  # 8 slots for 3 workers
    assert lost_node.room_left(nodes, PER_WORKER, 3, "STRICT_SPREAD") == 2  # two nodes


class WorkerGroupStartupTimeoutError(Exception):
    """Ray Train's own (ray.train.v2._internal.exceptions: not public API, so not imported
    here either): what its controller gives up with when it cannot place the worker group.
    wellfed knows it by its name and its `num_workers`."""

    def __init__(self, num_workers: int):
        super().__init__(f"The worker group startup timed out after 60.0 seconds waiting for "
                         f"{num_workers} workers. Potential causes include: ...")
        self.num_workers = num_workers


def unplaced_failure(workers: int) -> TrainingFailed:
    """What the driver turns Ray's ControllerError over a start-up timeout into."""
    from ray.train import ControllerError

    from wellfed.train.run.failures import worker_failure

    return worker_failure(ControllerError(WorkerGroupStartupTimeoutError(workers)))


def test_a_group_ray_could_not_place_is_a_shortage_even_where_the_cluster_lists_room(
        run, monkeypatch, capsys):
    """The first node lost in a two-raylet run ended in Ray's WorkerGroupStartupTimeoutError
    after its restarts, then `training failed`: the driver still saw room for both workers (the
    dead node listed alive). Ray could not place them: the run shrinks to what is free."""
    uri, run_id = run
    monkeypatch.setattr(lost_node.cluster, "live_nodes", lambda: [{"CPU": 1.0}, {"CPU": 1.0}])
    monkeypatch.setattr(lost_node.cluster, "available", lambda: {"CPU": 1.0})
    failure = unplaced_failure(2)
    assert failure.unplaced == 2 and "WorkerGroupStartupTimeoutError" not in str(failure)
    asked = RayConfig(num_workers=2, cpus_per_worker=1, max_failures=2)
    train = TrainConfig(global_batch_size=16, micro_batch_size=8)
    assert lost_node.after_ray_train(asked, asked, PER_WORKER, train, 40, uri, run_id) is None
    shrunk = lost_node.after_ray_train(asked, asked, PER_WORKER, train, 40, uri, run_id,
                                       unplaced=failure.unplaced)
    assert shrunk.num_workers == 1
    line = capsys.readouterr().out.strip()
    assert line == (
        "[wellfed] a node was lost or its room is held: Ray could not place the run's 2 "
        "worker(s) after its restarts (ray.max_failures: 2, each start waiting "
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S); the cluster lists 2 node(s), 2 CPUs, 0 GPUs, "
        "with free room for 1 of the run's 2 worker(s); the checkpoint of step 40 is kept; "
        "continuing on 1 "
        "worker(s) from step 40, the same global batch of 16 rows (2 micro-batch(es) per "
        "worker per step), into the same MLflow run (ray.on_lost_node: shrink)")
    assert "training failed" not in line
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    assert tags["derived.world_sizes"] == "2,1"


def test_a_group_ray_could_not_place_with_nothing_free_stops_in_one_line(run, monkeypatch):
    uri, run_id = run
    monkeypatch.setattr(lost_node.cluster, "live_nodes", lambda: [{"CPU": 2.0}])
    monkeypatch.setattr(lost_node.cluster, "available", lambda: {"CPU": 0.5})
    asked = RayConfig(num_workers=2, cpus_per_worker=1)
    with pytest.raises(TrainingFailed) as stop:
        lost_node.after_ray_train(asked, asked, PER_WORKER, TrainConfig(), 40, uri, run_id,
                                  unplaced=unplaced_failure(2).unplaced)
    assert "free room for 0 of the run's 2 worker(s)" in str(stop.value)
    assert "add a node that can hold a worker" in str(stop.value)
    assert not str(stop.value).startswith("training failed")


def test_other_ray_failures_place_nothing_apart():
    from ray.train import ControllerError

    from wellfed.train.run.failures import not_placed

    assert not_placed(ControllerError(RuntimeError("the controller's own error"))) == 0
    assert not_placed(RuntimeError("not Ray's")) == 0
