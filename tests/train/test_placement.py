"""Trials placed by Ray (train/placement.py) on a local Ray that declares 2 logical GPUs: whole
GPUs go to at most two trials at once, each its own CUDA_VISIBLE_DEVICES, a third waits in
Ray's queue and says so; shares of 0.5 run four at once. The trials here are stand-ins that
record when and where they ran (the pipeline's own trials: tests/e2e/test_sweep.py)."""

from __future__ import annotations

import threading
import time

import pytest

from wellfed.train import placement


@pytest.fixture(scope="module")
def two_gpus():
    import ray

    # address="local": a Ray of its own, never a `ray start` cluster another test left running
    ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False,
             log_to_driver=True, configure_logging=False)
    yield
    ray.shutdown()


def stand_in():
    """A trial that records when and where it ran; made here, so that Ray ships it by value
    (a Ray worker cannot import a test module by name)."""
    def stamp(seconds: float) -> tuple[float, float, str]:
        import os
        import time

        start = time.time()
        time.sleep(seconds)
        return start, time.time(), os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return stamp


def run_trials(n: int, gpus: float, seconds: float = 3.0) -> list[tuple[float, float, str]]:
    """`n` trials at once, as `dvc queue start -j n` starts them (a thread each here)."""
    results: list = [None] * n

    def trial(i):
        results[i] = placement.run_placed(stand_in(), seconds, need=placement.request(1, gpus),
                                          label=f"trial {i}")

    threads = [threading.Thread(target=trial, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
        time.sleep(0.3)  # in order, so the last one finds the GPUs taken
    for t in threads:
        t.join(timeout=120)
    return results


def running_at(results, t: float) -> list[str]:
    """The devices of the trials running at time t."""
    return [d for s, e, d in results if s <= t < e]


def most_at_once(results) -> int:
    return max(len(running_at(results, start)) for start, _, _ in results)


def test_whole_gpus_run_two_trials_at_once_on_their_own_gpus(two_gpus, capfd):
    results = run_trials(3, gpus=1)
    assert all(results) and most_at_once(results) == 2
    for start, _, _ in results:  # trials running together have GPUs of their own
        devices = running_at(results, start)
        assert len(set(devices)) == len(devices)
    assert {d for _, _, d in results} <= {"0", "1"}
    assert "trial 2: waiting in Ray's queue for 1 CPU, 1 GPU" in capfd.readouterr().out


def test_shares_of_a_gpu_run_four_trials_at_once(two_gpus):
    results = run_trials(4, gpus=0.5)
    assert all(results) and most_at_once(results) == 4
    devices = [d for _, _, d in results]
    assert sorted(devices).count("0") == 2 and sorted(devices).count("1") == 2


def test_a_trial_that_cannot_ever_fit_and_its_own_errors_are_one_line(two_gpus):
    with pytest.raises(ValueError, match="asks Ray for 3 GPU but the cluster has 2"):
        placement.run_placed(stand_in(), 0, need=placement.request(1, 3))

    def boom():
        raise RuntimeError("loss was not finite")

    with pytest.raises(RuntimeError, match="loss was not finite"):
        placement.run_placed(boom, need=placement.request(1, 0))
