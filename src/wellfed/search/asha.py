"""The search one trial at a time (search.fuse false, or a space that cannot fuse): Ray Tune
runs each trial in a warm worker (search/trial.py), Optuna's TPE proposes, ASHA stops, and the
final check is a grid of finalist x seed; both phases resumable from their folder
(search/tuning.py). The fused search is search/halving.py.
"""

from __future__ import annotations

from wellfed.config import SearchConfig
from wellfed.search import endings, proof, space, story, tuning
from wellfed.search.rungs import Rungs, milestones
from wellfed.search.trial import Setting


def search_phase(cfg: SearchConfig, setting: Setting, p, need: dict, uri: str,
                  parent: str) -> tuning.Phase:
    import optuna
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from wellfed.search.trial import run_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created..."
    mode = "min" if p.lower else "max"
    # TPE's random start: Optuna's 10 is most of a 16-trial search; a third of it, 3 at least.
    sampler = optuna.samplers.TPESampler(seed=cfg.searcher_seed,
                                         n_startup_trials=max(3, min(10, cfg.trials // 3)))
    searcher = OptunaSearch(space.optuna_space(cfg.dimensions()), metric=p.metric, mode=mode,
                            sampler=sampler)
    scheduler = ASHAScheduler(time_attr="step", grace_period=cfg.min_steps, max_t=p.full,
                              reduction_factor=cfg.reduction_factor)
    teller = story.Story(uri, parent, p.search_id, "search", p.folder, p.metric,
                         Rungs([m for m in milestones(cfg.min_steps, p.full,
                                                      cfg.reduction_factor) if m < p.full],
                               cfg.reduction_factor, p.lower), p.full, cfg.trials)
    phase = tuning.run_phase("tune-search", p.folder,
                             tune.with_parameters(run_trial, setting=setting), need,
                             teller.callback(), searcher=searcher, scheduler=scheduler,
                             metric=p.metric, mode=mode, samples=cfg.trials,
                             expected=cfg.trials, concurrent=cfg.concurrent,
                             done=lambda: len(story.ledger(p.folder, "search")))
    if phase.interrupted:
        teller.interrupted()
        endings.stale(uri, parent, p.search_id)  # restored, Tune calls its own copy of teller
    return phase


def proof_phase(cfg: SearchConfig, setting: Setting, p, need: dict, uri: str,
                 parent: str, chosen: list[dict]) -> tuning.Phase:
    from ray import tune

    from wellfed.search.trial import run_trial

    print(f"[wellfed] final check: {len(chosen)} finalist(s) x {len(cfg.seeds)} seeds at "
          f"{p.full} steps: " + "; ".join(space.shown(r["recipe"]) for r in chosen), flush=True)
    teller = story.Story(uri, parent, p.search_id, "proof", p.folder, p.metric,
                         Rungs([], cfg.reduction_factor, p.lower), p.full,
                         len(chosen) * len(cfg.seeds))
    configs = proof.proof_configs(chosen, list(cfg.seeds))
    phase = tuning.run_phase("tune-proof", p.folder,
                             tune.with_parameters(run_trial, setting=setting), need,
                             teller.callback(), param_space={"proof": tune.grid_search(configs)},
                             expected=len(configs), concurrent=cfg.concurrent,
                             done=lambda: len(story.ledger(p.folder, "proof")), restore=False)
    if phase.interrupted:
        teller.interrupted()
        endings.stale(uri, parent, p.search_id)  # restored, Tune calls its own copy of teller
    return phase
