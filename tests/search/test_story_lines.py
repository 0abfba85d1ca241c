"""The search's console lines as a user reads them (Story driven by hand, as Ray Tune's
callback would: no Ray, a real MLflow store): a line when a trial starts, at each rung with
the figure, the cutoff and the decision, inside the final check at each validation, and a
resume's "resuming: N of M finished"; the fused search's rankings at its rungs in the same
words; Ray Tune's warnings go to search.log, not the console."""

from __future__ import annotations

import logging

from wellfed.search import console, story
from wellfed.search.rungs import Rungs

METRIC = "val/macro_f1"


def report(step: int, value: float) -> dict:
    return {"step": step, METRIC: value, "val/loss": 1 - value, "records": [[step, 0.5, 1e-4]]}


def test_a_trial_is_said_when_it_starts_at_each_rung_and_when_it_ends(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = story.parent_run(uri, "exp", "s-test", {"search.trials": 2})
    folder = tmp_path / "search"
    teller = story.Story(uri, parent, "s-test", "search", folder, METRIC,
                         Rungs([4, 8], 2, lower_is_better=False), 16, total=2)
    for trial, lr, values in (("aaaa1111", 1e-4, (0.6, 0.7, 0.8)),
                              ("bbbb2222", 1e-3, (0.5,))):
        teller.start(trial, {"train.lr": lr})  # two recipes: one recipe twice is a replay
        for step, value in zip((4, 8, 16), values):
            teller.result(trial, report(step, value))
        teller.complete(trial)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[wellfed]")]
    assert lines == [
        "[wellfed] search trial aaaa1111 started: train.lr=0.0001",
        "[wellfed] search trial aaaa1111 at rung 1 of 2 (step 4): val/macro_f1 0.6000, the "
        "first there: promoted",
        "[wellfed] search trial aaaa1111 at rung 2 of 2 (step 8): val/macro_f1 0.7000, the "
        "first there: promoted",
        lines[3],  # the progress line: its minutes vary
        "[wellfed] search trial bbbb2222 started: train.lr=0.001",
        "[wellfed] search trial bbbb2222 at rung 1 of 2 (step 4): val/macro_f1 0.5000, cutoff "
        "0.6000: stopped",
        lines[6],
    ], "\n".join(lines)
    assert lines[3].startswith("[wellfed] search 1/2 (") and \
        "trial aaaa1111 completed 16 steps" in lines[3]
    assert lines[6].startswith("[wellfed] search 2/2 (") and \
        "trial bbbb2222 stopped by ASHA at rung 1 of 2 (step 4)" in lines[6]
    # the search view's first column: each trial's end in a few words
    stops = {trial: teller.client.get_run(run).data.tags[story.STOP_TAG]
             for trial, run in teller.runs.items()}
    assert stops == {"aaaa1111": "completed 16 steps",
                     "bbbb2222": "stopped at step 4: 0.5000 < 0.6000"}

    # the final check: its runs named by finalist and seed, a line at each validation
    check = story.Story(uri, parent, "s-test", "proof", folder, METRIC,
                        Rungs([], 2, lower_is_better=False), 16, total=2)
    config = {"proof": {"recipe": {"train.lr": 1e-4}, "seed": 2, "finalist": 0}}
    check.start("ccce9_00001", config)
    for step, value in ((4, 0.6), (8, 0.7), (16, 0.8)):
        check.result("ccce9_00001", report(step, value))
    check.complete("ccce9_00001")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[wellfed]")]
    assert lines[:3] == [
        "[wellfed] final check finalist 1, seed 2 started: train.lr=0.0001",
        "[wellfed] final check finalist 1, seed 2 at step 4 of 16: val/macro_f1 0.6000",
        "[wellfed] final check finalist 1, seed 2 at step 8 of 16: val/macro_f1 0.7000"]
    assert lines[3].startswith("[wellfed] final check 1/2 (") and \
        "finalist 1, seed 2 completed 16 steps" in lines[3], lines[3]
    assert not any("ccce9" in line for line in lines)  # Tune's grid ids are bookkeeping

    # what a rerun says first
    assert console.resumed(folder, 16, 6) == (
        "resuming: 2 of 16 search trials finished, 1 of 6 final-check runs (kept: handed "
        "back to Ray Tune, not trained again)")
    assert console.resumed(tmp_path / "new", 16, 6) is None


def test_ray_tunes_warnings_go_to_the_search_log_and_errors_also_to_the_console(tmp_path,
                                                                                 capsys):
    tune = logging.getLogger("ray.tune")
    before = (list(tune.handlers), tune.propagate)
    try:
        path = console.ray_tune_to_log(tmp_path)
        console.ray_tune_to_log(tmp_path)  # again: still one file handler
        slow = logging.getLogger("ray.tune.utils.util")
        slow.warning("The `process_trial_result` operation took 0.612 s, which may be a "
                     "performance bottleneck.")
        logging.getLogger("ray.tune.execution.tune_controller").error("Trial x errored")
        try:
            raise FileNotFoundError("Failed to open local file 'searcher-state-tmp'")
        except FileNotFoundError:
            logging.getLogger("ray.tune.execution.experiment_state").exception(
                "Saving experiment state to storage failed with exception: ")
        err = capsys.readouterr().err
        assert "performance bottleneck" not in err and "Trial x errored" in err
        assert "Traceback" not in err and err.splitlines()[-1] == (
            "ERROR ray.tune.execution.experiment_state: Saving experiment state to storage "
            f"failed with exception: (the traceback: {path})")
        text = path.read_text()
        assert text.count("performance bottleneck") == 1 and "Trial x errored" in text
        assert "Traceback" in text and "searcher-state-tmp" in text
    finally:
        put_back(tune, before)


def test_a_trials_output_goes_to_its_log_file(tmp_path, capsys):
    import sys

    with console.trial_output(str(tmp_path / "trials"), "aaaa1111"):
        print("model: 4.4M params")
        print("Loading weights: 100%", file=sys.stderr)
    with console.trial_output("", "bbbb2222"):
        print("dropped")
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
    assert (tmp_path / "trials" / "aaaa1111.log").read_text() == \
        "model: 4.4M params\nLoading weights: 100%\n"
    assert len(list(tmp_path.rglob("*.log"))) == 1


def test_the_default_search_says_each_trial_at_a_rung_promoted_or_stopped_with_the_cutoff(
        monkeypatch, tmp_path, capsys):
    """The fused search's successive halving (search/rounds.py, without Ray) told to a real
    Story: after a rung's ranking, its rule and cutoff (the last figure kept) in one line, then
    each trial best first in ASHA's words; a rerun says none of them again."""
    from types import SimpleNamespace

    from tests.search.test_halving import SPACE, Asked, fake_ray
    from wellfed.config import SearchConfig
    from wellfed.search import rounds

    def trained(task, members, setting, threads, states, start=0, stop_at=0):
        step = stop_at or setting.full
        return [{"reports": [report(step, m[2]["lr"] / 10 + step / 100)]} for m in members]

    fake_ray(monkeypatch, trained)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = story.parent_run(uri, "exp", "s-test", {})
    cfg = SearchConfig(space=SPACE, trials=6, reduction_factor=3)
    setting = SimpleNamespace(rungs=(4, 12, 36), full=36)
    p = SimpleNamespace(folder=tmp_path / "search", metric=METRIC, lower=False)
    (p.folder / "groups").mkdir(parents=True)
    ids = [f"s_{n:05d}" for n in range(6)]

    def search() -> list[str]:
        teller = story.Story(uri, parent, "s-test", "search", p.folder, METRIC,
                             Rungs([], 3, lower_is_better=False), 36, total=6)
        assert rounds.search_rounds(cfg, setting, p, teller, Asked(), ids, 4) is None
        return [line for line in capsys.readouterr().out.splitlines() if " rung " in line
                and "search: to rung" not in line]  # not the groups' lines

    lines = search()
    assert lines[:8] == [
        "[wellfed] search at rung 1 of 3 (step 4): the best 2 of the 6 go on; cutoff "
        "val/macro_f1 0.4400 (the last of them)",
        "[wellfed] search trial s_00005 at rung 1 of 3 (step 4): val/macro_f1 0.5400, cutoff "
        "0.4400: promoted",
        "[wellfed] search trial s_00004 at rung 1 of 3 (step 4): val/macro_f1 0.4400, cutoff "
        "0.4400: promoted",
        "[wellfed] search trial s_00003 at rung 1 of 3 (step 4): val/macro_f1 0.3400, cutoff "
        "0.4400: stopped",
        "[wellfed] search trial s_00002 at rung 1 of 3 (step 4): val/macro_f1 0.2400, cutoff "
        "0.4400: stopped",
        "[wellfed] search trial s_00001 at rung 1 of 3 (step 4): val/macro_f1 0.1400, cutoff "
        "0.4400: stopped",
        "[wellfed] search trial s_00000 at rung 1 of 3 (step 4): val/macro_f1 0.0400, cutoff "
        "0.4400: stopped",
        lines[7]], "\n".join(lines)
    assert "trial s_00000 stopped by successive halving at rung 1 of 3 (step 4)" in lines[7]
    assert lines[-4:-2] == [
        "[wellfed] search at rung 2 of 3 (step 12): the best 1 of the 2 go on; cutoff "
        "val/macro_f1 0.6200 (the last of them)",
        "[wellfed] search trial s_00005 at rung 2 of 3 (step 12): val/macro_f1 0.6200, cutoff "
        "0.6200: promoted"]
    assert sum(line.endswith(": stopped") for line in lines) == 5  # every stop, once
    assert search() == []  # rerun: all ended or gone on, nothing said again

    # a large rung: the promoted one line each, the stopped in one (each said as it ends)
    monkeypatch.setattr(rounds, "LISTED", 3)
    p.folder = tmp_path / "again"
    (p.folder / "groups").mkdir(parents=True)
    parent = story.parent_run(uri, "exp", "s-again", {})
    lines = search()
    assert lines[:4] == [lines[0], lines[1], lines[2],
                         "[wellfed] search at rung 1 of 3 (step 4): 4 trials stopped, below "
                         "the cutoff (each said as it ends)"]
    assert lines[1].endswith("promoted") and lines[2].endswith("promoted")


def test_the_start_line_says_what_trains_at_once_on_either_path(monkeypatch, tmp_path, capsys):
    """With ASHA, trials of ray.cpus_per_worker each (or search.concurrent); fused, up to K per
    group x the groups Ray has room for side by side (search.concurrent groups at most)."""
    from types import SimpleNamespace

    import ray

    from tests.search.test_halving import SPACE
    from wellfed.config import SearchConfig
    from wellfed.search import driver, tuning

    have = {"CPU": 16.0, "GPU": 2.0}
    monkeypatch.setattr(ray, "cluster_resources", lambda: have)
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": have}])
    plan = driver.Plan("s-test", tmp_path, METRIC, False, 36, (4, 12, 36), 256, "single_label")
    gpu = SimpleNamespace(use_gpu=True, threads=4)
    cpu = SimpleNamespace(use_gpu=False, threads=1)

    def said(setting, k: int, concurrent: int = 0, trials: int = 16) -> str:
        cfg = SearchConfig(space=SPACE, trials=trials, concurrent=concurrent)
        need = tuning.resources(setting.threads, 1 if setting.use_gpu else 0)
        driver._say_start(cfg, plan, "p", driver.at_once(cfg, setting, need, k), "", k)
        first = capsys.readouterr().out.splitlines()[0]
        return first.split(f"{trials} trials, ", 1)[1].split(", over", 1)[0].split(" over ")[0]

    tune = logging.getLogger("ray.tune")
    before = (list(tune.handlers), tune.propagate)
    try:
        assert said(cpu, 0) == ("16 at once (search.concurrent 0: as many as Ray fits (16 "
                                "CPUs, ray.cpus_per_worker 1 each))")
        assert said(cpu, 0, concurrent=3) == "3 at once (search.concurrent)"
        assert said(gpu, 4) == ("8 at once (up to 4 per fused group x 2 groups side by side; "
                                "search.concurrent 0: Ray fits 2, a GPU and 4 CPU(s) each)")
        assert said(gpu, 4, concurrent=1) == ("4 at once (up to 4 per fused group x 1 group "
                                              "side by side; search.concurrent 1)")
        assert said(gpu, 4, concurrent=3) == (
            "8 at once (up to 4 per fused group x 2 groups side by side; search.concurrent 3, "
            "but Ray fits 2: a GPU and 4 CPU(s) each)")
        assert said(gpu, 4, trials=6) == ("6 at once (up to 4 per fused group x 2 groups side "
                                          "by side; search.concurrent 0: Ray fits 2, a GPU and "
                                          "4 CPU(s) each)")
        have.pop("GPU")
        assert said(cpu, 1) == ("16 at once (groups of one x 16 groups side by side; "
                                "search.concurrent 0: Ray fits 16, 1 CPU(s) each)")
        assert said(cpu, 4) == ("4 at once (up to 4 per fused group x 1 group side by side; "
                                "search.concurrent 0: Ray fits 1, 16 CPU(s) each)")
    finally:
        put_back(tune, before)


def put_back(logger, before: tuple) -> None:
    """Ray Tune's logger as it was (its handlers, `propagate`) before a test sent it to a file."""
    for h in logger.handlers[:]:
        if h not in before[0]:
            logger.removeHandler(h)
            h.close()
    logger.propagate = before[1]
