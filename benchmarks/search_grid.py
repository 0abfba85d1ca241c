"""A contender of benchmarks/search.py, in a fresh process: the full grid at full budget, on
wellfed's own warm trials (the same Ray Tune workers, placement and MLflow child runs as
wellfed-search, but every recipe trained to the end and no scheduler), then the grid's best
recipe retrained over the seeds. Also retrains any recipe over the seeds (`retrain`): the
Trainer contender's choice is retrained here, by the same code, so recipes are compared and
not trainers.

usage (in a project whose params.yaml has its search section and whose data/tokens exist):
  python benchmarks/search_grid.py grid '<json list of recipes>'
  python benchmarks/search_grid.py retrain '<json recipe>'
Prints one line `[result] {json}`: wall from process start, steps, the best recipe, and every
retrained run's validation figure and predictions.
"""

import time

STARTED = time.time()

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


def main(mode: str, given: str) -> dict:
    from ray import tune

    from wellfed.cluster import connect, local_token_auth
    from wellfed.config import load_params
    from wellfed.search import driver, proof, story, tuning
    from wellfed.search.rungs import Rungs
    from wellfed.search.trial import run_trial
    from wellfed.track.tracking import tracking_uri

    search_cfg, train_cfg, model_cfg, data_cfg, ray_cfg, mlflow_cfg = load_params(
        "params.yaml", "search", "train", "model", "data", "ray", "mlflow")
    tokens = Path("data/tokens")
    meta = json.loads((tokens / "meta.json").read_text())
    p = driver.plan(search_cfg, train_cfg, model_cfg, tokens, meta, Path("data/bench") / mode)
    p.folder.mkdir(parents=True, exist_ok=True)
    uri = tracking_uri(mlflow_cfg.tracking_uri, Path.cwd())
    parent = story.parent_run(uri, mlflow_cfg.experiment, f"{mode}-{p.search_id}", {})
    tuning.environment()
    local_token_auth(ray_cfg)
    connect(ray_cfg)
    setting, need = driver.placed(p, train_cfg, model_cfg, data_cfg, ray_cfg, tokens, meta)
    out: dict = {"mode": mode}

    def phase(name: str, configs: list[dict]) -> None:
        teller = story.Story(uri, parent, f"{mode}-{p.search_id}", name, p.folder, p.metric,
                             Rungs([], 2, p.lower), p.full, len(configs))
        tuning.run_phase(f"tune-{name}", p.folder,
                         tune.with_parameters(run_trial, setting=setting), need,
                         teller.callback(), param_space={"proof": tune.grid_search(configs)},
                         expected=len(configs), concurrent=search_cfg.concurrent,
                         done=lambda: len(story.ledger(p.folder, name)))

    if mode == "grid":
        recipes = json.loads(given)
        phase("grid", [{"recipe": r, "seed": train_cfg.seed, "finalist": i}
                       for i, r in enumerate(recipes)])
        found = story.ledger(p.folder, "grid")
        out["grid_wall_s"] = round(time.time() - STARTED, 1)
        out["grid_steps"] = sum(int(e["reports"][-1]["step"]) for e in found.values())
        ranked = sorted(found.values(), key=lambda e: e["reports"][-1][p.metric],
                        reverse=not p.lower)
        out["trials"] = [{"recipe": e["config"]["proof"]["recipe"],
                          p.metric: e["reports"][-1][p.metric]} for e in ranked]
        best = ranked[0]["config"]["proof"]["recipe"]
    else:
        best = json.loads(given)
    out["best_recipe"] = best
    mark = time.time()
    phase("retrain", proof.proof_configs([{"recipe": best}], list(search_cfg.seeds)))
    out["retrain_wall_s"] = round(time.time() - mark, 1)
    out["retrained"] = [{"seed": e["config"]["proof"]["seed"], p.metric: e["reports"][-1][p.metric],
                         "predicted": e["reports"][-1].get("predicted")}
                        for e in story.ledger(p.folder, "retrain").values()]
    out["wall_s"] = round(time.time() - STARTED, 1)
    return out


if __name__ == "__main__":
    print("[result] " + json.dumps(main(sys.argv[1], sys.argv[2])), flush=True)
