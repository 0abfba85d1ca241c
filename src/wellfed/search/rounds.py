"""Successive halving across the whole search, in step: the fused search phase.

Every trial first trains to the first rung, K at a time in fused groups, TPE proposing each
group from the figures of every trial there before it. Then all of them are ranked together,
the best 1/reduction_factor go on to the next rung, regrouped K at a time from each trial's
saved slice of its group's state (train/trials/resume.py), and so on to the full budget: the
synchronous successive halving of Jamieson & Talwalkar, which on the benchmark's 16 trials
trains 496 steps where halving inside each group of 4 trained 704 and ASHA 752.

The search folder keeps `rounds.json` (each trial's recipe, seed, reports and the step it
reached; written when a group ends) and `groups/<trial>@<step>.pt` (a trial's state at the rung
it goes on from). A stopped search goes on from there: a group cut off trains again from its
trials' last rung, nothing before it. A slice is deleted once its trial can no longer go on
(another trial's figure pushed it out of the best at its rung) or has gone on.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

from wellfed.outputs import write_json
from wellfed.search import fused

BOOK = "rounds.json"
LISTED = 16
"""Trials at a rung said one line each (the search's default 16); past it, the stopped in one."""


def even(items: list, k: int) -> list[list]:
    """`items` in the fewest groups of at most k, as even as can be (5 at K=4: 3 + 2)."""
    n = math.ceil(len(items) / k) if items else 0
    return [items[i * len(items) // n:(i + 1) * len(items) // n] for i in range(n)]


class Book:
    """What the search has trained, trial by trial (`rounds.json`)."""

    def __init__(self, folder: Path):
        self.path = folder / BOOK
        self.trials: dict[str, dict] = (json.loads(self.path.read_text(encoding="utf-8"))
                                        if self.path.is_file() else {})

    def record(self, trial: str, config: dict, seed: int, reports: list[dict]) -> None:
        entry = self.trials.setdefault(trial, {"config": config, "seed": seed, "reports": []})
        entry["reports"] += reports
        entry["step"] = int(reports[-1]["step"]) if reports else entry.get("step", 0)
        write_json(self.path, self.trials)

    def adopt(self, finished: dict[str, dict]) -> None:
        """Trials a search begun by an older wellfed (halving inside each group) finished: kept
        as they ended, ranked with the others at the rungs they reached."""
        for trial, entry in finished.items():
            reports = entry["reports"]
            self.trials[trial] = {"config": entry["config"], "reports": reports, "ended": True,
                                  "seed": reports[-1].get("seed") if reports else None,
                                  "step": int(reports[-1]["step"]) if reports else 0}
        write_json(self.path, self.trials)

    def end(self, trial: str) -> None:
        self.trials[trial]["ended"] = True
        write_json(self.path, self.trials)

    def figure(self, trial: str, step: int, metric: str) -> float:
        found = [r[metric] for r in self.trials[trial]["reports"]
                 if int(r["step"]) == step and metric in r]
        return float(found[-1]) if found else math.nan

    def at(self, step: int) -> list[str]:
        """The trials that reached `step`, in the order they were proposed."""
        return [t for t, e in sorted(self.trials.items()) if e["step"] >= step]


def best(book: Book, step: int, metric: str, lower: bool, count: int) -> list[str]:
    """The `count` best trials at `step` (a trial with no figure there counts last)."""
    def key(trial: str):
        value = book.figure(trial, step, metric)
        return (math.isnan(value), value if lower else -value)

    return sorted(book.at(step), key=key)[:count]


def search_rounds(cfg, setting, p, teller, proposer, ids: list[str], k: int) -> int | None:
    """Train the search phase's trials `ids` with successive halving across all of them;
    returns the signal that stopped it, or None."""
    import ray

    need, threads = fused.place_group(setting, k)
    run = Rounds(ray.remote(fused.train_group).options(**need), setting, threads,
                 p.folder / "groups", teller, Book(p.folder), p.metric, p.lower, k,
                 slots(cfg, need))
    rungs = sorted({r for r in setting.rungs if r < setting.full} | {setting.full})
    with fused.polite_stop() as received:
        try:
            run.first_rung(ids, rungs, proposer, cfg.seeds[0], cfg.reduction_factor)
            for level in range(1, len(rungs)):
                run.next_rung(rungs, level, cfg.reduction_factor)
            for trial in run.book.at(rungs[-1]):  # recorded, then killed before it was ended
                if not run.book.trials[trial].get("ended"):
                    ended(teller, run.book, trial)
        except KeyboardInterrupt:
            teller.interrupted()
            return received[0] if received else signal.SIGINT
    return None


class Rounds:
    """The search's groups, rung after rung; within a rung, as many groups at once as Ray has
    room for (`slots`: one per GPU; a node's CPUs for a fused group, ray.cpus_per_worker for
    a group of one)."""

    def __init__(self, task, setting, threads: int, states: Path, teller, book: Book,
                 metric: str, lower: bool, k: int, slots: int = 1):
        self.task, self.setting, self.threads, self.states = task, setting, threads, states
        self.teller, self.book, self.metric, self.lower, self.k = teller, book, metric, lower, k
        self.slots = max(1, slots)

    def first_rung(self, ids: list[str], rungs: list[int], proposer, seed: int,
                   rf: int) -> None:
        """Every trial to the first rung, TPE proposing each group (when a device is free for
        it) from those there before."""
        step = rungs[0]
        groups = even([t for t in ids if t not in self.book.trials], self.k)

        def proposals():
            for n, trials in enumerate(groups, 1):
                members = fused.proposed(self.states, [(t, None, None, seed) for t in trials],
                                         proposer)
                print(f"[wellfed] search: to rung 1 of {len(rungs)} (step {step}), group {n}/"
                      f"{len(groups)}: {len(members)} trial(s) fused "
                      f"({', '.join(m[0] for m in members)})", flush=True)
                yield members

        def done(members: list[tuple], results: list[dict]) -> None:
            proposer.tell(members, results)
            (self.states / f"{members[0][0]}-members.json").unlink(missing_ok=True)
            going = best(self.book, step, self.metric, self.lower, max(1, len(ids) // rf))
            spent(self.states, set(self.book.at(step)) - set(going), step)

        self.train(proposals(), 0, step if step < self.setting.full else 0, done)

    def next_rung(self, rungs: list[int], level: int, rf: int) -> None:
        """The best 1/rf of the trials at rung `level` (its step) to the next; the rest end."""
        here, there = rungs[level - 1], rungs[level]
        reached = self.book.at(here)
        keep = best(self.book, here, self.metric, self.lower, max(1, len(reached) // rf))
        halved(self.teller, self.book, reached, keep, (here, there), level, len(rungs),
               self.metric, self.lower)
        spent(self.states, set(reached) - set(keep), here)
        # gone on already (a search killed after a group was recorded, before its slices here
        # were deleted): nothing trains from them again
        spent(self.states, {t for t in keep if self.book.trials[t]["step"] >= there}, here)
        groups = even([t for t in keep if self.book.trials[t]["step"] < there
                       and not self.book.trials[t].get("ended")], self.k)

        def members():
            for n, trials in enumerate(groups, 1):
                entries = [self.book.trials[t] for t in trials]
                print(f"[wellfed] search: to rung {level + 1} of {len(rungs)} (step {there}), "
                      f"group {n}/{len(groups)}: {len(trials)} trial(s) fused, the best "
                      f"{len(keep)} of the {len(reached)} at step {here} ({', '.join(trials)})",
                      flush=True)
                yield [(t, e["config"], e["config"], e["seed"]) for t, e in zip(trials, entries)]

        self.train(members(), here, there if there < self.setting.full else 0,
                   lambda trained, _results: spent(self.states, {m[0] for m in trained}, here))

    def train(self, groups, start: int, stop_at: int, done) -> None:
        """Train `groups` (an iterator, drawn when a device is free) from step `start` (their
        trials' slices there; 0: afresh) to `stop_at` (0: the full budget), `slots` at once;
        as each ends, its trials' reports go to their child runs and the book, then
        `done(members, results)`."""
        def submit(members: list[tuple]):
            for trial, config, _recipe, _seed in members:
                opened(self.teller, self.book, trial, config)
            return fused.submit(self.task, members, self.setting, self.threads, self.states,
                                start, stop_at)

        def ended_group(members: list[tuple], results: list[dict]) -> None:
            self.record(members, results, stop_at)
            done(members, results)

        side_by_side(submit, groups, self.slots, ended_group)

    def record(self, members: list[tuple], results: list[dict], stop_at: int) -> None:
        for trial, *_rest in members if stop_at else []:
            kept = self.states / f"{trial}@{stop_at}.pt"
            if not kept.is_file():  # written on the machine that trained the group
                raise ValueError(
                    f"trial {trial}'s state at step {stop_at} is not in {kept.parent}: its group "
                    "trained on another machine of the Ray cluster, and the next rung's group "
                    "must read it; put data/search on storage every machine shares (a "
                    "symlink to an NFS folder), or set search.fuse: false (ASHA, one trial at "
                    "a time)")
        for (trial, config, _recipe, seed), got in zip(members, results):
            for report in got["reports"]:
                report["phase"] = "search"
                self.teller.result(trial, report)
            self.book.record(trial, config, seed, got["reports"])
            if not stop_at:
                ended(self.teller, self.book, trial)


def slots(cfg, need: dict) -> int:
    """Groups at once: as many as Ray has room for (fused.groups_at_once), at most
    search.concurrent where it is set."""
    fit = fused.groups_at_once(need)
    return min(fit, cfg.concurrent) if cfg.concurrent else fit


def side_by_side(submit, groups, slots: int, done) -> None:
    """Run `groups` (an iterator of member lists, drawn when a device is free) by
    `submit(members)` (a Ray task's ref), `slots` at once, calling `done(members, results)`
    as each ends. A group the device runs out of memory for trains again as two
    (fused.halves); a stop cancels every group under way."""
    import ray

    running: dict = {}
    again: list[list[tuple]] = []
    try:
        while True:
            while len(running) < slots and (members := again.pop(0) if again
                                            else next(groups, None)) is not None:
                running[submit(members)] = members
            if not running:
                return
            (ready,), _ = ray.wait(list(running), num_returns=1)
            members = running.pop(ready)
            try:
                results = ray.get(ready)
            except ray.exceptions.RayTaskError as error:
                again[:0] = fused.halves(error, members)
                continue
            done(members, results)
    except KeyboardInterrupt:
        for ref in running:
            ray.cancel(ref, force=True)
        raise


def halved(teller, book: Book, reached: list[str], keep: list[str], steps: tuple[int, int],
           level: int, levels: int, metric: str, lower: bool) -> None:
    """The ranking at a rung (step `steps[0]`; those kept go on to `steps[1]`), said as ASHA's
    decisions are (search/rungs.py): one line for the rule and its cutoff (the figure of the
    last trial kept), then best first one per trial whose fate is news (a resumed search says
    none again that ended or went on before), promoted or stopped, with its figure and the
    cutoff; past LISTED of them, the stopped in one line (each one's figure is on its end's
    line). The trials that do not go on end there, each told why in words."""
    step, there = steps
    cutoff = book.figure(keep[-1], step, metric)
    rung = f"rung {level} of {levels} (step {step})"
    among = f"(the best {len(keep)} of the {len(reached)} in the search go on)"
    news = [t for t in best(book, step, metric, lower, len(reached))
            if not book.trials[t].get("ended")
            and (t not in keep or book.trials[t]["step"] < there)]
    if news:
        print(f"[wellfed] search at {rung}: the best {len(keep)} of the {len(reached)} go on; "
              f"cutoff {metric} {cutoff:.4f} (the last of them)", flush=True)
    stopped = [t for t in news if t not in keep]
    for trial in news if len(news) <= LISTED else [t for t in news if t in keep]:
        print(f"[wellfed] search trial {trial} at {rung}: {metric} "
              f"{book.figure(trial, step, metric):.4f}, cutoff {cutoff:.4f}: "
              f"{'promoted' if trial in keep else 'stopped'}", flush=True)
    if len(news) > LISTED and stopped:
        print(f"[wellfed] search at {rung}: {len(stopped)} trials stopped, "
              f"{'above' if lower else 'below'} the cutoff (each said as it ends)", flush=True)
    for trial in reached:
        if trial in keep or book.trials[trial].get("ended"):
            continue
        value = book.figure(trial, step, metric)
        teller.rungs.said[trial] = (
            f"stopped by successive halving at {rung}: {metric} {value:.4f} was "
            f"{'above' if lower else 'below'} the cutoff {cutoff:.4f} {among}")
        teller.rungs.rung_of[trial] = rung
        teller.rungs.short[trial] = (f"stopped at step {step}: {value:.4f} "
                                     f"{'>' if lower else '<'} {cutoff:.4f}")
        ended(teller, book, trial)


def opened(teller, book: Book, trial: str, config: dict) -> None:
    """The trial's child run, open in this process: at its first group, or again in a resumed
    search, its reports so far handed back (logged before: not again; kept for its ledger)."""
    if trial in teller.runs:
        return
    teller.start(trial, config, by_config=False)
    for report in book.trials.get(trial, {}).get("reports", []):
        teller.result(trial, report)


def ended(teller, book: Book, trial: str) -> None:
    opened(teller, book, trial, book.trials[trial]["config"])
    teller.complete(trial)
    book.end(trial)


def spent(states: Path, trials: set[str], step: int) -> None:
    """Delete the slices at `step` of `trials`: gone on, or out of the running."""
    for trial in trials:
        (states / f"{trial}@{step}.pt").unlink(missing_ok=True)
