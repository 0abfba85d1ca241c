"""Ray Tune's saved state of a search is checked like a checkpoint before a resume reads it: a
planted pickle is refused in one line and never runs, a state cut short (a full disk under
Ray's syncer) is named and set aside, and what Tune saves for a search passes."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from wellfed.search import tune_state, tuning


class Planted:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def phase(tmp_path):
    folder = tmp_path / "s-0123456789" / "tune-search"
    folder.mkdir(parents=True)
    (folder / ".validate_storage_marker").write_bytes(b"")
    (folder / "experiment_state-2026-11-28_10-00-00.json").write_text(json.dumps(
        {"trial_data": [[json.dumps({"config": {"train.lr": 0.001}}), "{}"]]}))
    return folder


def saved_like_tune(folder) -> None:
    """What Ray Tune 2.60 pickles for a search (tuner.pkl's parts and the searcher's state):
    its configs, ASHA, Optuna's TPE with a seeded sampler, the search's callback."""
    import optuna
    from ray import cloudpickle, tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from wellfed.search.tune_callback import StoryCallback

    searcher = OptunaSearch({"train.lr": optuna.distributions.FloatDistribution(1e-5, 1e-2,
                                                                                log=True)},
                            metric="val/macro_f1", mode="max",
                            sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3))
    tuner = {"tune_config": tune.TuneConfig(search_alg=searcher, scheduler=ASHAScheduler(
        time_attr="step", grace_period=2, max_t=8), num_samples=4, reuse_actors=True),
        "run_config": tune.RunConfig(name="tune-search", storage_path=str(folder.parent),
                                     callbacks=[StoryCallback(None)],
                                     failure_config=tune.FailureConfig(max_failures=1)),
        "path": folder}
    (folder / "tuner.pkl").write_bytes(cloudpickle.dumps(tuner))
    (folder / "searcher-state-2026-11-28_10-00-00.pkl").write_bytes(
        cloudpickle.dumps(searcher.__dict__))


def test_what_tune_saves_for_a_search_passes(phase):
    saved_like_tune(phase)
    assert tune_state.fault(phase) is None


def test_a_planted_pickle_is_refused_and_never_runs(phase, tmp_path, capsys):
    saved_like_tune(phase)
    marker = tmp_path / "PWNED"
    (phase / "tuner.pkl").write_bytes(pickle.dumps({"x": Planted(marker)}))
    assert tune_state.fault(phase) == ("tuner.pkl: it names posix.system, which a search's "
                                       "state never holds")
    tuning.checked(phase, restore=True)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "[wellfed] Ray Tune's state of this phase cannot be used (tuner.pkl: it names "
        "posix.system") and "set aside as " in lines[0] and "not trained again" in lines[0]
    assert not phase.exists() and (phase.parent / "tune-search.damaged" / "tuner.pkl").is_file()
    assert not marker.exists()


def test_code_pickled_by_value_and_a_pickle_inside_the_json_are_refused(phase, tmp_path):
    from ray import cloudpickle

    saved_like_tune(phase)
    (phase / "searcher-state-2026-11-28_10-00-00.pkl").write_bytes(
        cloudpickle.dumps(lambda: None))
    assert "ray.cloudpickle.cloudpickle." in tune_state.fault(phase)
    saved_like_tune(phase)
    blob = {"_type": "CLOUDPICKLE_FALLBACK", "value": pickle.dumps(Planted(tmp_path / "x")).hex()}
    (phase / "experiment_state-2026-11-28_10-00-00.json").write_text(json.dumps(
        {"trial_data": [[json.dumps({"storage": blob}), "{}"]]}))
    assert tune_state.fault(phase) == ("experiment_state-2026-11-28_10-00-00.json holds a "
                                       "pickle: it names posix.system, which a search's state "
                                       "never holds")
    assert not (tmp_path / "x").exists()


def test_a_state_cut_short_is_named_and_set_aside_in_one_line(phase, capsys):
    saved_like_tune(phase)
    state = phase / "experiment_state-2026-11-28_10-00-00.json"
    state.write_bytes(state.read_bytes()[:20])  # the syncer's copy when the disk filled
    assert tune_state.fault(phase).startswith(
        "experiment_state-2026-11-28_10-00-00.json is not whole (")
    (phase.parent / "tune-search.damaged").mkdir()  # set aside once before
    tuning.checked(phase, restore=True)
    (line,) = capsys.readouterr().out.splitlines()
    assert "s-0123456789/tune-search.damaged-2;" in line
    assert (phase.parent / "tune-search.damaged-2" / state.name).is_file()


def test_an_empty_or_missing_state_file_is_a_fault_as_a_cut_one_is(phase):
    """A full disk can leave a file Ray's syncer opened with no byte in it, or no
    experiment_state at all beside tuner.pkl: both would restore a phase Tune then restarts."""
    saved_like_tune(phase)
    searcher = phase / "searcher-state-2026-11-28_10-00-00.pkl"
    searcher.write_bytes(b"")
    assert tune_state.fault(phase) == ("searcher-state-2026-11-28_10-00-00.pkl is empty (cut "
                                       "short before its first byte)")
    saved_like_tune(phase)
    (phase / "experiment_state-2026-11-28_10-00-00.json").unlink()
    assert tune_state.fault(phase) == ("it has tuner.pkl but no experiment_state-*.json "
                                       "(never copied whole)")


def test_a_phase_that_is_not_restored_never_reads_its_old_state(phase, tmp_path, capsys):
    marker = tmp_path / "PWNED"
    (phase / "tuner.pkl").write_bytes(pickle.dumps(Planted(marker)))
    tuning.checked(phase, restore=False)  # the final check's grid starts afresh
    assert not phase.exists() and not marker.exists() and capsys.readouterr().out == ""
