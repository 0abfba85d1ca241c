"""Phases add up per name, and the train stage's worker parts replace its "train" phase."""

from tests.conftest import CountedClock
from wellfed.telemetry.phases import Phases


def test_phases_add_up_per_name_in_first_seen_order():
    now = CountedClock()
    clock = Phases({"imports": 1.5}, clock=now)
    with clock("steps"):
        now.advance(0.25)
    with clock("validation"):
        now.advance(0.125)
    with clock("steps"):
        now.advance(0.5)
    assert list(clock.seconds) == ["imports", "steps", "validation"]
    assert clock.seconds == {"imports": 1.5, "steps": 0.75, "validation": 0.125}
    assert clock.total() == 2.375


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
