"""The two phases of a fused search (search/fused.py trains the groups): the search phase,
TPE proposing each group of K recipes from every trial at the first rung before it and
successive halving across all of them (search/rounds.py), and the final check, the finalists
x seeds in groups of K (`proof_grouping`: on a GPU fused across seeds, each trial its own
batches, dropout and head init, train/trials/apart.py; on a CPU by seed), where a finalist's own
full-budget search trial stands for its seed when that seed is one of them (trained once, not
twice).
"""

from __future__ import annotations

import signal

from wellfed.config import SearchConfig
from wellfed.search import fused, proof, rounds, space, story, tuning
from wellfed.search.rungs import Rungs
from wellfed.search.trial import Setting


def trial_id(search_id: str, phase: str, n: int) -> str:
    """`684ba_00003` (search) or `684ba_p0003` (final check): one style, the search's in it."""
    return f"{search_id[2:7]}_{'p' if phase == 'proof' else ''}{n:0{4 if phase == 'proof' else 5}d}"


class Proposer:
    """Optuna's TPE, asked for one group at a time and told each trial's figure at the first
    rung (the one every trial reaches); a resumed search tells it every trial there again
    first, in order."""

    def __init__(self, cfg: SearchConfig, metric: str, lower: bool, done: dict[str, dict]):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.metric, self.dists = metric, space.optuna_space(cfg.dimensions())
        # TPE's random start: a third of the trials, 3 to 10 (as the ASHA search's). A resumed
        # search's sampler starts from another seed: the same one would draw its first random
        # recipes again, the ones the finished trials already hold.
        sampler = optuna.samplers.TPESampler(seed=cfg.searcher_seed + len(done),
                                             n_startup_trials=max(3, min(10, cfg.trials // 3)))
        self.study = optuna.create_study(direction="minimize" if lower else "maximize",
                                         sampler=sampler)
        self.pending: dict[str, object] = {}
        for _trial, entry in sorted(done.items()):
            scored = [r for r in entry["reports"] if metric in r]
            if scored:
                self.study.add_trial(optuna.trial.create_trial(
                    params=entry["config"], distributions=self.dists,
                    value=float(scored[-1][metric])))

    def __call__(self, members: list[tuple]) -> list[tuple]:
        out = []
        for trial, _config, _recipe, seed in members:
            asked = self.study.ask(self.dists)
            self.pending[trial] = asked
            recipe = space.rounded(asked.params)
            out.append((trial, recipe, recipe, seed))
        return out

    def again(self, members: list[tuple]) -> list[tuple]:
        """The members of the group a stopped search was training, as it proposed them: told
        to TPE once they finish, as trials it did not ask for."""
        for trial, *_rest in members:
            self.pending[trial] = None
        return members

    def tell(self, members: list[tuple], results: list[dict]) -> None:
        import optuna

        for (trial, config, *_rest), got in zip(members, results):
            scored = [r for r in got["reports"] if self.metric in r]
            value = float(scored[-1][self.metric]) if scored else None
            asked = self.pending.pop(trial)
            if asked is not None:
                self.study.tell(asked, value, state=None if scored else _failed())
            elif scored:
                self.study.add_trial(optuna.trial.create_trial(
                    params=config, distributions=self.dists, value=value))


def _failed():
    import optuna

    return optuna.trial.TrialState.FAIL


def chunks(items: list, k: int) -> list[list]:
    return [items[i:i + k] for i in range(0, len(items), k)]


def search_phase(cfg: SearchConfig, setting: Setting, p, uri: str, parent: str,
                 k: int) -> tuning.Phase:
    """Successive halving across all the search's trials, K at a time (search/rounds.py)."""
    book = rounds.Book(p.folder)
    if not book.trials and (older := story.ledger(p.folder, "search")):
        book.adopt(older)  # finished under halving inside each group: kept as they ended
    teller = story.Story(uri, parent, p.search_id, "search", p.folder, p.metric,
                         Rungs([], cfg.reduction_factor, p.lower), p.full, cfg.trials)
    if book.trials:
        ended = sum(1 for e in book.trials.values() if e.get("ended"))
        print(f"[wellfed] resuming: {len(book.trials)} of {cfg.trials} search trials reached "
              f"the first rung, {ended} of them ended (TPE is told them again; no step is "
              "trained again before a trial's last rung)", flush=True)
    # TPE is told each trial's figure at the first rung, where every trial has one. The
    # search's trials train at the first seed of the final check, so that the finalist that
    # reaches the full budget is already one of its seeds' runs.
    first = min(setting.rungs)
    told = {t: {"config": e["config"], "reports": [r for r in e["reports"]
                                                   if int(r["step"]) == first]}
            for t, e in book.trials.items()}
    ids = [trial_id(p.search_id, "search", n) for n in range(cfg.trials)]
    stopped = rounds.search_rounds(cfg, setting, p, teller,
                                   Proposer(cfg, p.metric, p.lower, told), ids, k)
    return tuning.Phase("fused-search", stopped, [])


def proof_phase(cfg: SearchConfig, setting: Setting, p, uri: str, parent: str,
                chosen: list[dict], k: int) -> tuning.Phase:
    configs = proof.proof_configs(chosen, list(cfg.seeds))
    print(f"[wellfed] final check: {len(chosen)} finalist(s) x {len(cfg.seeds)} seeds at "
          f"{p.full} steps, " + "; ".join(space.shown(r["recipe"]) for r in chosen), flush=True)
    teller = story.Story(uri, parent, p.search_id, "proof", p.folder, p.metric,
                         Rungs([], cfg.reduction_factor, p.lower), p.full, len(configs))
    done = story.ledger(p.folder, "proof")
    found = story.ledger(p.folder, "search")
    todo = []
    for n, config in enumerate(configs):
        trial = trial_id(p.search_id, "proof", n)
        if trial in done:
            continue
        own = reused(found.get(chosen[config["finalist"]]["trial"]), config, setting, p)
        if own is not None:  # the finalist's own search trial, at full budget, this seed
            teller.start(trial, {"proof": config}, by_config=False)
            for report in own:
                teller.result(trial, {**report, "phase": "proof"})
            teller.complete(trial)
            continue
        todo.append((trial, {"proof": config}, config["recipe"], config["seed"]))
    groups, how = proof_grouping(todo, list(cfg.seeds), k, setting.use_gpu)
    if todo:
        print(f"[wellfed] final check: {len(todo)} run(s) to train, {how}", flush=True)
    stopped = proof_groups(groups, cfg, setting, teller, k)
    return tuning.Phase("fused-proof", stopped, [])


def proof_grouping(todo: list[tuple], seeds: list[int], k: int,
                   gpu: bool) -> tuple[list[list[tuple]], str]:
    """The final check's runs to train ((trial, config, recipe, seed) each) as groups of up to
    `k`, and how, in a few words. Trials of one seed share their batches; trials of different
    seeds in one group each bring their own, padded to one shape (train/trials/apart.py). On a
    GPU across seeds, in seed order (one seed's trials together where K allows): the fewest
    groups, on the expectation that a small model's step there costs about as much at twice
    the tokens (not yet measured on a GPU: benchmarks/gpu_fused_trials.py's across-seeds case
    is for that). On a CPU every token padded is paid (4 seeds fused stepped at 0.62x the
    trials alone, benchmarks/results/fused_trials_apart.json): by seed."""
    ordered = sorted(todo, key=lambda m: seeds.index(m[3]))
    if k <= 1:
        return chunks(ordered, 1), "in groups of one (K = 1: fusing gains nothing on this device)"
    if gpu:
        return chunks(ordered, k), f"fused across seeds in groups of up to {k} (a GPU)"
    return ([g for seed in seeds for g in chunks([m for m in ordered if m[3] == seed], k)],
            f"fused by seed in groups of up to {k} (a CPU pays for the padding that trials of "
            "different seeds in one group need)")


def proof_groups(groups: list[list[tuple]], cfg: SearchConfig, setting: Setting, teller,
                 k: int) -> int | None:
    """Train each group (a list of (trial id, Tune-style config, recipe, seed)) to the full
    budget, validating at the rungs, side by side where Ray has room; a group writes its state
    at each rung and goes on from it after a stop. Returns the signal that stopped the phase,
    or None."""
    import ray

    need, threads = fused.place_group(setting, k)
    task = ray.remote(fused.train_group).options(**need)
    states = teller.folder / "groups"
    numbered = {id(members): n for n, members in enumerate(groups, 1)}

    def submit(members: list[tuple]):
        n = numbered.get(id(members))
        print(f"[wellfed] proof group {n or '(a half)'}/{len(groups)}: {len(members)} trial(s) "
              f"fused ({', '.join(m[0] for m in members)})", flush=True)
        for trial, config, _recipe, _seed in members:
            teller.start(trial, config, by_config=False)
        return fused.submit(task, members, setting, threads, states)

    def done(members: list[tuple], results: list[dict]) -> None:
        if resumed := max(r.get("resumed_at", 0) for r in results):
            print(f"[wellfed] proof group {numbered.get(id(members), '(a half)')}/{len(groups)} "
                  f"went on from its last rung (step {resumed}): the steps before it were not "
                  "trained again", flush=True)
        if said := padding(results[0].get("tokens", {})):
            print(f"[wellfed] proof group {numbered.get(id(members), '(a half)')}/{len(groups)}"
                  f": {said}", flush=True)
        for (trial, _config, _recipe, _seed), got in zip(members, results):
            for report in got["reports"]:
                report["phase"] = "proof"
                teller.result(trial, report)
            teller.complete(trial)
        for trial, *_rest in members:  # recorded: the group's state is spent
            for path in states.glob(f"{trial}-*"):
                path.unlink()

    with fused.polite_stop() as received:
        try:
            rounds.side_by_side(submit, iter(groups), rounds.slots(cfg, need), done)
        except KeyboardInterrupt:
            teller.interrupted()
            return received[0] if received else signal.SIGINT
    return None


def padding(tokens: dict) -> str:
    """What trials of different seeds in one group cost in padding, in a few words ('' when
    nothing: one seed)."""
    computed, alone = tokens.get("computed", 0), tokens.get("alone", 0)
    if not alone or computed <= alone:
        return ""
    return (f"its trials' own batches, padded to one shape, computed {computed / alone:.2f}x "
            f"the tokens they compute alone ({computed:,} for {alone:,}; "
            f"{tokens.get('real', 0):,} real)")


def reused(entry: dict | None, config: dict, setting: Setting, p) -> list | None:
    """A search trial's reports as a final-check run of `config`: when it trained the same
    recipe with the same seed to the full budget (and kept its predictions where the verdict
    needs them), it is that run."""
    last = entry["reports"][-1] if entry and entry["reports"] else {}
    if last.get("seed") != config["seed"] or int(last.get("step", 0)) < p.full or (setting.task == "single_label"
                                             and "predicted" not in last):
        return None
    return entry["reports"]
