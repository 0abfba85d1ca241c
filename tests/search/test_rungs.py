"""`Rungs` says why ASHA stopped a trial: it must agree with Ray Tune's ASHAScheduler on every
trial (run here for real, on a trainable with no model: 12 trials of made-up scores)."""

from __future__ import annotations

import pytest

from wellfed.search.rungs import Rungs, milestones, validation_steps


def test_milestones_are_min_steps_times_the_factor_below_the_budget():
    assert milestones(16, 188, 2) == [16, 32, 64, 128]
    assert milestones(16, 64, 2) == [16, 32, 64]
    assert milestones(4, 100, 3) == [4, 12, 36]
    assert validation_steps(16, 188, 2) == (16, 32, 64, 128, 188)
    assert validation_steps(16, 64, 2) == (16, 32, 64)


def test_a_stop_is_said_with_its_rung_cutoff_and_count():
    rungs = Rungs([4, 8], 2, lower_is_better=False)
    assert rungs.observe("a", 4, 0.8, "val/macro_f1") == \
        "rung 1 of 2 (step 4): val/macro_f1 0.8000, the first there: promoted"
    assert rungs.observe("b", 4, 0.6, "val/macro_f1") == \
        "rung 1 of 2 (step 4): val/macro_f1 0.6000, cutoff 0.8000: stopped"
    assert rungs.observe("a", 6, 0.9, "val/macro_f1") is None  # between milestones: no line
    assert rungs.short == {"a": "went on at step 4: 0.8000, the first there",
                           "b": "stopped at step 4: 0.6000 < 0.8000"}  # a narrow column's
    assert rungs.said["a"] == "continued at rung 1 of 2 (step 4): the first there"
    assert rungs.said["b"].startswith("stopped by ASHA at rung 1 of 2 (step 4): val/macro_f1 "
                                      "0.6000 was below the cutoff 0.8000")
    lower = Rungs([4, 8], 2, lower_is_better=True)
    lower.observe("a", 4, 0.3, "val/loss")
    lower.observe("b", 4, 0.5, "val/loss")
    assert "val/loss 0.5000 was above the cutoff 0.3000" in lower.said["b"]
    assert lower.short["b"] == "stopped at step 4: 0.5000 > 0.3000"


def scores(config):
    import zlib

    from ray import tune

    base = (zlib.crc32(str(config["x"]).encode()) % 1000) / 1000
    for step in (4, 8, 16, 32):
        tune.report({"step": step, "score": base + step / 1000 + (step == 8) * config["x"] / 10})


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["max", "min"])
def test_rungs_agree_with_ray_tunes_asha_on_every_trial(tmp_path, mode, local_ray):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    steps = [m for m in milestones(4, 32, 2) if m < 32]
    rungs, last, lines = Rungs(steps, 2, lower_is_better=mode == "min"), {}, {}

    class Mirror(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            line = rungs.observe(trial.trial_id, result["step"], result["score"], "score")
            if line:
                lines.setdefault(trial.trial_id, []).append(line)
            last[trial.trial_id] = result["step"]

    tune.Tuner(tune.with_resources(scores, {"cpu": 1}),
               param_space={"x": tune.grid_search([0.1 * i for i in range(12)])},
               tune_config=tune.TuneConfig(scheduler=ASHAScheduler(
                   time_attr="step", grace_period=4, max_t=32, reduction_factor=2),
                   metric="score", mode=mode, max_concurrent_trials=2, reuse_actors=True),
               run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0,
                                         callbacks=[Mirror()])).fit()
    assert len(last) == 12
    stopped_by_asha = {t for t, step in last.items() if step < 32}
    said_stopped = {t for t, text in rungs.said.items() if text.startswith("stopped")}
    assert stopped_by_asha and stopped_by_asha == said_stopped
    # the console's line at each rung says the same: a stopped trial's last line is its stop
    assert {t for t, said in lines.items() if said[-1].endswith(": stopped")} == stopped_by_asha
    assert all(s.endswith(": promoted") for said in lines.values() for s in said[:-1])
