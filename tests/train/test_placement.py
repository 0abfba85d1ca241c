"""Trials placed by Ray (train/run/placement.py) on a local Ray that declares 2 logical GPUs: whole
GPUs go to at most two trials at once, each its own CUDA_VISIBLE_DEVICES, a third waits in
Ray's queue and says so; shares of 0.5 run four at once. The trials here are stand-ins that say
where they run and wait until the test lets them go (the pipeline's own trials:
tests/e2e/test_sweep.py)."""

from __future__ import annotations

import threading
import time

import pytest

from wellfed.train.run import placement


@pytest.fixture(scope="module")
def two_gpus():
    import ray

    # address="local": a Ray of its own, never a `ray start` cluster another test left running
    ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False,
             log_to_driver=True, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture
def gate(two_gpus):
    """Where the stand-in trials say they started (and on which GPUs) and wait to be let go:
    the test decides when each trial ends, so which trials run together is counted, not read
    from wall-clock stamps that a loaded machine spreads apart (a 3 s trial could end before
    Ray had started the fourth)."""
    import ray

    @ray.remote(num_cpus=0)
    class Gate:
        def __init__(self):
            self.started, self.released, self.running, self.most = {}, set(), 0, 0
            self.all_go = False

        def start(self, label: str, devices: str) -> None:
            self.started[label] = devices
            self.running += 1
            self.most = max(self.most, self.running)

        def leaves(self, label: str) -> bool:
            """Whether `label` was let go; it counts as ended from then on."""
            if label in self.released or self.all_go:
                self.running -= 1
                return True
            return False

        def release(self, *labels: str) -> None:
            self.released.update(labels)

        def release_all(self) -> None:
            self.all_go = True

        def state(self) -> tuple[dict, int]:
            return dict(self.started), self.most

    gate = Gate.remote()
    yield gate
    # Every trial let go, also when the test failed before it released them: a failed test's
    # trials held both GPUs, and the module's next test then waited out its 300 s hang guard
    # too (fresh-check, 2026-11-29: two failures and 10 minutes for one).
    ray.get(gate.release_all.remote())


def stand_in():
    """A trial that says where it runs and waits to be let go; made here, so that Ray ships it
    by value (a Ray worker cannot import a test module by name)."""
    def trial(gate, label: str) -> str:
        import os
        import time

        import ray

        devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ray.get(gate.start.remote(label, devices))
        while not ray.get(gate.leaves.remote(label)):
            time.sleep(0.05)
        return devices
    return trial


def wait_for(condition, what: str, limit_s: float = 300) -> None:
    """Poll `condition` until it holds; `limit_s` is a hang guard, not part of the verdict."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)


def start_trial(gate, label: str, gpus: float, results: dict) -> threading.Thread:
    """A trial, as `dvc queue start -j n` starts one (a thread here)."""
    def run():
        results[label] = placement.run_placed(stand_in(), gate, label,
                                              need=placement.request(1, gpus), label=label)

    thread = threading.Thread(target=run, daemon=True)  # never holds the worker's exit
    thread.start()
    return thread


def started(gate) -> dict:
    import ray

    return ray.get(gate.state.remote())[0]


@pytest.mark.integration
def test_whole_gpus_run_two_trials_at_once_on_their_own_gpus(gate, capfd):
    import ray

    results: dict = {}
    threads = [start_trial(gate, f"trial {i}", 1, results) for i in range(2)]
    wait_for(lambda: len(started(gate)) == 2, "two trials to start")
    wait_for(lambda: ray.available_resources().get("GPU", 0) == 0, "Ray to see both GPUs taken")
    threads.append(start_trial(gate, "trial 2", 1, results))
    out = ""

    def said_it_waits() -> bool:
        nonlocal out
        out += capfd.readouterr().out
        return "trial 2: waiting in Ray's queue" in out

    wait_for(said_it_waits, "trial 2 to say it waits")
    assert "trial 2: waiting in Ray's queue for 1 CPU, 1 GPU" in out
    assert sorted(started(gate)) == ["trial 0", "trial 1"]  # it waits while both GPUs are held
    ray.get(gate.release.remote("trial 0"))
    wait_for(lambda: "trial 2" in started(gate), "trial 2 to start once trial 0 ended")
    ray.get(gate.release.remote("trial 1", "trial 2"))
    for thread in threads:
        thread.join(timeout=300)
    devices, most = ray.get(gate.state.remote())
    assert most == 2 and devices["trial 0"] != devices["trial 1"]  # each its own GPU
    assert devices["trial 2"] == devices["trial 0"]  # the GPU trial 0 gave back
    assert set(devices.values()) == {"0", "1"} and results == devices


@pytest.mark.integration
def test_shares_of_a_gpu_run_four_trials_at_once(gate):
    import ray

    results: dict = {}
    threads = [start_trial(gate, f"trial {i}", 0.5, results) for i in range(4)]
    wait_for(lambda: len(started(gate)) == 4, "four trials on two GPUs at once")
    ray.get(gate.release.remote(*(f"trial {i}" for i in range(4))))
    for thread in threads:
        thread.join(timeout=300)
    devices, most = ray.get(gate.state.remote())
    assert most == 4 and sorted(devices.values()) == ["0", "0", "1", "1"] and results == devices


@pytest.mark.integration
def test_a_trial_that_cannot_ever_fit_and_its_own_errors_are_one_line(two_gpus):
    with pytest.raises(ValueError, match="asks Ray for 3 GPU but the cluster has 2"):
        placement.run_placed(stand_in(), None, "never", need=placement.request(1, 3))

    def boom():
        raise RuntimeError("loss was not finite")

    with pytest.raises(RuntimeError, match="loss was not finite"):
        placement.run_placed(boom, need=placement.request(1, 0))
