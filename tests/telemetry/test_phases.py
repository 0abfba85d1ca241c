"""Phases add up per name, and the train stage's worker parts replace its "train" phase."""

import time

from wellfed.telemetry.phases import Phases


def test_phases_add_up_per_name_in_first_seen_order():
    clock = Phases({"imports": 1.5})
    with clock("steps"):
        time.sleep(0.01)
    with clock("validation"):
        pass
    with clock("steps"):
        time.sleep(0.01)
    assert list(clock.seconds) == ["imports", "steps", "validation"]
    assert clock.seconds["steps"] >= 0.02 and clock.seconds["validation"] < clock.seconds["steps"]
    assert abs(clock.total() - sum(clock.seconds.values())) < 1e-12


def test_a_phase_that_raises_is_still_timed():
    clock = Phases()
    try:
        with clock("export"):
            raise OSError("disk full")
    except OSError:
        pass
    assert "export" in clock.seconds


def test_train_is_split_into_the_workers_parts_and_what_was_around_them():
    from wellfed.telemetry.phases import split_train

    worker = {"setup": 3.0, "steps": 20.0}
    assert split_train({"export": 1.0, "train": 25.0}, worker) == {
        "export": 1.0, "setup": 3.0, "steps": 20.0, "train start/stop": 2.0}
    on_ray = split_train({"ray start": 4.0, "train": 45.0}, worker)
    assert on_ray["ray train start/stop"] == 22.0 and "train" not in on_ray
