"""The fused search's pieces without Ray: successive halving's decision and its words, TPE
asked a group at a time and told the finished trials again at a resume, trial ids in one
style, and when a finalist's own search trial stands for a final-check run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from wellfed.config import ModelConfig, SearchConfig, TrainConfig
from wellfed.search import fused, halving

SPACE = {"train": {"lr": "log_uniform 1e-5 1e-3", "warmup_ratio": "uniform 0.0 0.2"}}


def test_tpe_is_asked_a_group_at_a_time_and_a_resume_tells_it_the_finished_trials():
    cfg = SearchConfig(space=SPACE, trials=8)
    proposer = halving.Proposer(cfg, "val/macro_f1", False, {})
    members = proposer([("a_00000", None, None, 1), ("a_00001", None, None, 1)])
    assert [m[0] for m in members] == ["a_00000", "a_00001"] and all(m[3] == 1 for m in members)
    for _trial, config, recipe, _seed in members:
        assert config == recipe and set(recipe) == {"train.lr", "train.warmup_ratio"}
        assert 1e-5 <= recipe["train.lr"] <= 1e-3
    proposer.tell(members, [{"reports": [{"step": 4, "val/macro_f1": 0.4}]},
                            {"reports": []}])  # a trial with no figure counts as failed
    assert [t.state.name for t in proposer.study.trials] == ["COMPLETE", "FAIL"]

    done = {"a_00000": {"config": members[0][1], "reports": [{"step": 4, "val/macro_f1": 0.4}]}}
    resumed = halving.Proposer(cfg, "val/macro_f1", False, done)
    assert len(resumed.study.trials) == 1
    again = resumed([("a_00001", None, None, 1)])[0][2]
    assert again != members[0][2]  # not the first random draw a second time


def test_trial_ids_have_one_style():
    assert halving.trial_id("s-684ba5adae", "search", 3) == "684ba_00003"
    assert halving.trial_id("s-684ba5adae", "proof", 3) == "684ba_p0003"


def test_a_finalists_own_trial_stands_for_its_seed_only_at_full_budget_with_predictions():
    p = SimpleNamespace(full=16)
    setting = SimpleNamespace(task="single_label")
    full = {"reports": [{"step": 4, "seed": 1}, {"step": 16, "seed": 1, "predicted": "AA=="}]}
    assert halving.reused(full, {"seed": 1}, setting, p) == full["reports"]
    assert halving.reused(full, {"seed": 2}, setting, p) is None
    stopped = {"reports": [{"step": 4, "seed": 1}]}
    assert halving.reused(stopped, {"seed": 1}, setting, p) is None
    bare = {"reports": [{"step": 16, "seed": 1}]}
    assert halving.reused(bare, {"seed": 1}, setting, p) is None
    assert halving.reused(bare, {"seed": 1}, SimpleNamespace(task="regression"), p) is not None
    assert halving.reused(None, {"seed": 1}, setting, p) is None


def test_a_space_beyond_the_update_is_not_fused_and_says_why(capsys):
    setting = SimpleNamespace(train=TrainConfig(), model=ModelConfig())
    lora = SearchConfig(space={"model": {"lora_r": "choice 8 16"}})
    assert "search.space.model.lora_r changes what fused trials share" in fused.refusal(
        lora, setting)
    assert fused.fused(lora, setting) is False
    assert "one at a time with ASHA (search.fuse auto)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="search.fuse is true but"):
        fused.fused(SearchConfig(space=lora.space, fuse="true"), setting)
    assert fused.fused(SearchConfig(space=SPACE), setting) is True
    assert fused.fused(SearchConfig(space=SPACE, fuse="false"), setting) is False


def test_a_group_the_device_runs_out_of_memory_for_is_trained_again_as_two_halves(monkeypatch,
                                                                                   capsys,
                                                                                   tmp_path):
    import ray
    import torch

    sent = []

    class Task:  # stands for ray.remote(train_group): .remote() hands its members on
        def remote(self, setting, members, *rest):
            sent.append(len(members))
            return members

    def get(members):
        if len(members) > 2:
            raise ray.exceptions.RayTaskError("train_group", "traceback", torch.OutOfMemoryError(
                "CUDA out of memory"))
        return [{"reports": [], "member": str(m)} for m in members]

    monkeypatch.setattr(ray, "get", get)
    members = [(f"t{i}", {}, {"i": i}, 1) for i in range(5)]
    out = fused.trained(Task(), members, None, 1, tmp_path)
    assert sent == [5, 2, 3, 1, 2]  # 5 -> 2 + 3 -> 2 + (1 + 2)
    assert [r["member"] for r in out] == [str(({"i": i}, 1)) for i in range(5)]  # in order
    lines = [line for line in capsys.readouterr().out.splitlines() if "out of device memory" in line]
    assert lines[0] == ("[wellfed] a group of 5 fused trials ran out of device memory: trained "
                        "again as 2 + 3")

    def fails(members):
        raise ray.exceptions.RayTaskError("train_group", "traceback", ValueError("bad"))

    monkeypatch.setattr(ray, "get", fails)
    with pytest.raises(ray.exceptions.RayTaskError):  # any other error is not retried
        fused.trained(Task(), members, None, 1, tmp_path)


class Teller:
    """Stands for search/story.Story: what each trial was told, in order."""

    def __init__(self):
        from wellfed.search.rungs import Rungs

        self.runs, self.told, self.done = {}, {}, []
        self.rungs = Rungs([], 3, False)

    def start(self, trial, config, by_config=True):
        self.runs[trial] = trial
        self.told.setdefault(trial, [])

    def result(self, trial, report):
        self.told[trial].append(report["step"])

    def complete(self, trial):
        self.done.append(trial)

    def interrupted(self):
        pass


class Asked:
    """Stands for TPE: recipe n has lr n, so the later trials are the better."""

    def __init__(self):
        self.told = []

    def __call__(self, members):
        return [(t, {"lr": int(t[-2:])}, {"lr": int(t[-2:])}, seed) for t, _c, _r, seed in members]

    def tell(self, members, results):
        self.told += [m[0] for m in members]


def fake_ray(monkeypatch, trained, slots: int = 1, events: list | None = None,
             writes: bool = True) -> None:
    """search/rounds.py without Ray: a group's task is `trained(task, members, setting,
    threads, states, start, stop_at)`, run when the driver gets its result, then (`writes`)
    each member's state file written as the task writes it; Ray's wait hands back the group
    started first."""
    import ray

    from wellfed.search import rounds

    class Ref:
        def __init__(self, *args):
            self.args = args
            if events is not None:
                events.append(("start", [m[0] for m in args[1]]))

    def get(ref):
        if events is not None:
            events.append(("end", [m[0] for m in ref.args[1]]))
        got = trained(*ref.args)
        _task, members, _setting, _threads, states, _start, stop_at = (ref.args + (0, 0))[:7]
        for m in members if writes and stop_at else []:
            (states / f"{m[0]}@{stop_at}.pt").write_text("slice")
        return got

    monkeypatch.setattr(rounds.fused, "submit", Ref)
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns=1: (refs[:1], refs[1:]))
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "cancel", lambda ref, force=False: None)
    monkeypatch.setattr(rounds.fused, "place_group", lambda setting, k=0: ({}, 1))
    monkeypatch.setattr(rounds.fused, "groups_at_once", lambda need: slots)


def test_halving_across_the_search_ranks_all_trials_at_each_rung_and_resumes(monkeypatch,
                                                                             tmp_path):
    from wellfed.search import rounds

    calls = []

    def trained(task, members, setting, threads, states, start=0, stop_at=0):
        calls.append(([m[0] for m in members], start, stop_at))
        if stop_at == 12 and len(calls) == 6:
            raise KeyboardInterrupt  # stopped in the second group to rung 2
        step = stop_at or setting.full
        for m in members:
            if stop_at:
                (states / f"{m[0]}@{stop_at}.pt").write_text("slice")
        return [{"reports": [{"step": step, "val/f1": m[2]["lr"] / 100 + step / 1000}]}
                for m in members]

    fake_ray(monkeypatch, trained)
    cfg = SearchConfig(space=SPACE, trials=16, reduction_factor=3)
    setting = SimpleNamespace(rungs=(4, 12, 36), full=36)
    p = SimpleNamespace(folder=tmp_path, metric="val/f1", lower=False)
    (tmp_path / "groups").mkdir()
    ids = [f"s_{n:05d}" for n in range(16)]
    first = Teller()
    assert rounds.search_rounds(cfg, setting, p, first, Asked(), ids, 4) == 2  # SIGINT
    assert [c[1:] for c in calls] == [(0, 4)] * 4 + [(4, 12)] * 2
    assert calls[4][0] == ["s_00015", "s_00014"]  # the best 5 of all 16, best first: 2 + 3
    assert calls[5][0] == ["s_00013", "s_00012", "s_00011"]
    assert sorted(first.done) == ids[:11]
    assert first.rungs.said["s_00000"] == (
        "stopped by successive halving at rung 1 of 3 (step 4): val/f1 0.0040 was below the "
        "cutoff 0.1140 (the best 5 of the 16 in the search go on)")
    # slices: only the best 5 at step 4 were kept, and the 2 gone on to step 12 spent there
    assert sorted(f.name for f in (tmp_path / "groups").glob("*.pt")) == [
        "s_00011@4.pt", "s_00012@4.pt", "s_00013@4.pt", "s_00014@12.pt", "s_00015@12.pt"]

    calls.clear()
    again = Teller()
    assert rounds.search_rounds(cfg, setting, p, again, Asked(), ids, 4) is None
    assert calls == [(["s_00013", "s_00012", "s_00011"], 4, 12), (["s_00015"], 12, 0)]
    assert again.told["s_00015"] == [4, 12, 36]  # its reports so far handed back, then on
    assert sorted(again.done) == ["s_00011", "s_00012", "s_00013", "s_00014", "s_00015"]
    assert "the best 1 of the 5 in the search go on" in again.rungs.said["s_00011"]
    assert not list((tmp_path / "groups").glob("*.pt"))  # every slice spent


def test_k_of_one_trains_groups_of_one_halved_in_step_but_asha_on_several_nodes(monkeypatch,
                                                                               tmp_path, capsys):
    import ray

    from wellfed.train.trials.sizing import Choice

    class Remote:
        def options(self, **need):
            return self

        def remote(self, *args):
            return Choice(1, "a step of 4 fused trials took 1.07x the time of 4 steps alone")

    logged = {}
    client = SimpleNamespace(set_tag=lambda run, k, v: logged.update({k: v}),
                             log_param=lambda run, k, v: logged.update({k: v}))
    nodes = [{"Alive": True}]
    monkeypatch.setattr(ray, "remote", lambda fn: Remote())
    monkeypatch.setattr(ray, "get", lambda ref: ref)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(fused, "place_group", lambda setting, k=0: ({}, 1))
    setting = SimpleNamespace(train=TrainConfig(), model=ModelConfig())
    cfg = SearchConfig(space=SPACE)
    assert fused.group_size(cfg, setting, client, "p", tmp_path) == 1
    assert "trials in groups of one, successive halving in step across the search" in \
        capsys.readouterr().out
    assert logged["search.fused_trials"] == 1
    nodes.append({"Alive": True})
    assert fused.group_size(cfg, setting, client, "p", tmp_path) == 0  # kept K, 2 nodes
    assert "with ASHA, side by side on the cluster's 2 nodes" in capsys.readouterr().out
    # a search begun by a wellfed that took K = 1 for ASHA goes on with ASHA
    (tmp_path / "fused.json").write_text('{"k": 1, "reason": "measured"}')
    nodes.pop()
    assert fused.group_size(cfg, setting, client, "p", tmp_path) == 0
    assert "with ASHA, as when the search began" in capsys.readouterr().out


def test_trials_an_older_search_finished_are_kept_as_they_ended_and_ranked(monkeypatch,
                                                                          tmp_path):
    """A search begun by a wellfed that halved inside each group: its ledger's trials are
    adopted (ended where they ended), only the trials it never began train."""
    from wellfed.search import rounds

    calls = []

    def trained(task, members, setting, threads, states, start=0, stop_at=0):
        calls.append(([m[0] for m in members], start, stop_at))
        return [{"reports": [{"step": stop_at or setting.full,
                              "val/f1": m[2]["lr"] / 100 + (stop_at or 36) / 1000}]}
                for m in members]

    fake_ray(monkeypatch, trained)
    book = rounds.Book(tmp_path)
    book.adopt({f"s_{n:05d}": {"config": {"lr": n}, "reports": [
        {"step": 4, "seed": 1, "val/f1": 0.9 if n == 0 else 0.01}]} for n in range(4)})
    cfg = SearchConfig(space=SPACE, trials=6, reduction_factor=3)
    setting = SimpleNamespace(rungs=(4, 12, 36), full=36)
    p = SimpleNamespace(folder=tmp_path, metric="val/f1", lower=False)
    teller = Teller()
    ids = [f"s_{n:05d}" for n in range(6)]
    assert rounds.search_rounds(cfg, setting, p, teller, Asked(), ids, 4) is None
    # the two new ones to rung 1; of the best 2 of 6 there, the adopted s_00000 stays ended
    assert calls == [(["s_00004", "s_00005"], 0, 4), (["s_00005"], 4, 12), (["s_00005"], 12, 0)]
    assert "s_00000" not in teller.done  # ended by the older search, not again


def test_groups_of_a_rung_train_side_by_side_where_ray_has_room(monkeypatch, tmp_path):
    """Two devices: two groups at once; TPE proposes each group when a device is free for it,
    from the trials ended before; a group the device ran out of memory for trains as two."""
    import ray
    import torch

    from wellfed.search import rounds

    events, told = [], []

    def trained(task, members, setting, threads, states, start=0, stop_at=0):
        if len(members) == 3 and start == 4:
            raise ray.exceptions.RayTaskError("train_group", "traceback",
                                              torch.OutOfMemoryError("CUDA out of memory"))
        return [{"reports": [{"step": stop_at or setting.full,
                              "val/f1": int(m[0][-2:]) / 100}]} for m in members]

    class Told(Asked):
        def tell(self, members, results):
            told.append([m[0] for m in members])

    fake_ray(monkeypatch, trained, slots=2, events=events)
    cfg = SearchConfig(space=SPACE, trials=16, reduction_factor=3)
    setting = SimpleNamespace(rungs=(4, 12, 36), full=36)
    p = SimpleNamespace(folder=tmp_path, metric="val/f1", lower=False)
    (tmp_path / "groups").mkdir()
    ids = [f"s_{n:05d}" for n in range(16)]
    assert rounds.search_rounds(cfg, setting, p, Teller(), Told(), ids, 4) is None
    first = [e for e in events[:8]]
    assert [kind for kind, _ in first] == ["start", "start", "end", "start", "end", "start",
                                          "end", "end"]  # two at a time, a third when one ends
    assert told == [ids[0:4], ids[4:8], ids[8:12], ids[12:16]]
    # rung 2: the best 5 as 2 + 3 side by side; the 3 ran out of memory: 1 + 2 instead
    later = [(kind, trials) for kind, trials in events[8:]]
    assert later[:4] == [("start", ["s_00015", "s_00014"]),
                         ("start", ["s_00013", "s_00012", "s_00011"]),
                         ("end", ["s_00015", "s_00014"]),
                         ("end", ["s_00013", "s_00012", "s_00011"])]
    assert ("start", ["s_00013"]) in later and ("start", ["s_00012", "s_00011"]) in later


def test_a_state_written_on_another_machine_stops_the_search_in_one_line(monkeypatch,
                                                                        tmp_path):
    from wellfed.search import rounds

    def trained(task, members, setting, threads, states, start=0, stop_at=0):
        return [{"reports": [{"step": stop_at, "val/f1": 0.5}]} for m in members]

    fake_ray(monkeypatch, trained, writes=False)  # the task's files landed elsewhere
    cfg = SearchConfig(space=SPACE, trials=2, reduction_factor=2)
    setting = SimpleNamespace(rungs=(4, 8), full=8)
    p = SimpleNamespace(folder=tmp_path, metric="val/f1", lower=False)
    with pytest.raises(ValueError, match=r"trial s_00000's state at step 4 is not in .*groups: "
                                         r"its group trained on another machine") as err:
        rounds.search_rounds(cfg, setting, p, Teller(), Asked(), ["s_00000", "s_00001"], 2)
    assert "\n" not in str(err.value) and "search.fuse: false" in str(err.value)


def test_the_final_check_fuses_across_seeds_on_a_gpu_and_by_seed_on_a_cpu():
    # finalist A's seed-1 run is its own search trial: A2, A3, B1, B2, B3 to train
    todo = [(f"t{f}{seed}", {}, {}, seed) for f in "AB" for seed in (1, 2, 3)
            if (f, seed) != ("A", 1)]
    ids = lambda groups: [[m[0] for m in g] for g in groups]  # noqa: E731
    gpu, how = halving.proof_grouping(todo, [1, 2, 3], 5, gpu=True)
    assert ids(gpu) == [["tB1", "tA2", "tB2", "tA3", "tB3"]] and "across seeds" in how
    assert ids(halving.proof_grouping(todo, [1, 2, 3], 2, gpu=True)[0]) == [
        ["tB1", "tA2"], ["tB2", "tA3"], ["tB3"]]  # the fewest groups, one seed's together
    cpu, how = halving.proof_grouping(todo, [1, 2, 3], 5, gpu=False)
    assert ids(cpu) == [["tB1"], ["tA2", "tB2"], ["tA3", "tB3"]] and "by seed" in how
    ones, how = halving.proof_grouping(todo, [1, 2, 3], 1, gpu=True)
    assert [len(g) for g in ones] == [1] * 5 and "groups of one" in how
