"""The search, top to bottom: plan it (metric, budget, rungs, id, folder), open its MLflow parent
run, start Ray, run the search phase and the final check (search/tuning.py), say the verdict,
and hand the winner to `dvc exp run` (search/winner.py).
"""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

from wellfed.config import (DataConfig, MlflowConfig, ModelConfig, RayConfig, SearchConfig,
                            TrainConfig, flatten)
from wellfed.outputs import write_json
from wellfed.search import (asha, console, edges, endings, fused, halving, lock, proof, report,
                            room, space, story, tuning)
from wellfed.search.rungs import validation_steps
from wellfed.search.trial import Setting


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the search is, before any trial: checked, named and placed."""

    search_id: str
    folder: Path
    metric: str
    lower: bool
    full: int
    rungs: tuple[int, ...]
    rows: int
    task: str


def plan(search_cfg: SearchConfig, train_cfg: TrainConfig, model_cfg: ModelConfig,
         tokens: Path, meta: dict, root: Path) -> Plan:
    """The ranked metric (one line naming search.metric when the task has no such figure), the
    full budget and its rungs, and the search's id and folder."""
    from wellfed.data.token_files import TokenFile
    from wellfed.train.step.selection import LOWER_IS_BETTER, val_keys
    from wellfed.train.step.setup import total_steps
    from wellfed.tasks import HEADLINE

    task = meta.get("task", "single_label")
    metric = HEADLINE[task] if search_cfg.metric == "auto" else search_cfg.metric
    if metric not in val_keys(task):
        raise ValueError(f"search.metric {search_cfg.metric!r} is not a validation figure of "
                         f"this {task} task (data/tokens/meta.json); use auto ({HEADLINE[task]}) "
                         f"or one of {', '.join(val_keys(task))}")
    rows = len(TokenFile(tokens / "train.arrow"))
    planned = total_steps(rows, train_cfg)
    full = search_cfg.full_steps(planned)
    rf = search_cfg.reduction_factor
    if search_cfg.min_steps * rf > full:
        what = (f"search.max_steps {search_cfg.max_steps}" if search_cfg.max_steps else
                f"search.max_steps 0 (the train section's {planned} steps)")
        raise ValueError(f"{what} leaves ASHA no rung to stop a trial at: it needs at least "
                         f"search.min_steps x search.reduction_factor = "
                         f"{search_cfg.min_steps * rf} steps; lower search.min_steps or set "
                         f"search.max_steps")
    digest = json.dumps(meta.get("split_fingerprints", {}), sort_keys=True)
    search_id = space.search_id(search_cfg, train_cfg, model_cfg, digest)
    return Plan(search_id, root / search_id, metric, metric in LOWER_IS_BETTER, full,
                validation_steps(search_cfg.min_steps, full, rf), rows, task)


def run(search_cfg: SearchConfig, train_cfg: TrainConfig, model_cfg: ModelConfig,
        data_cfg: DataConfig, ray_cfg: RayConfig, mlflow_cfg: MlflowConfig, tokens: Path,
        meta: dict, root: Path, project: Path, run_exp: bool = True, options: str = "") -> dict:
    """Run (or resume) the search; return its result (`stopped`: the exit code when a signal
    stopped it). `options`: the command line's sizes (`--trials 4`), recorded on the parent run
    as `search.options`."""
    import mlflow

    from wellfed.cluster import connect, local_token_auth
    from wellfed.track.tracking import local_store, tracking_uri
    from wellfed.train.checkpoints import daemons

    p = plan(search_cfg, train_cfg, model_cfg, tokens, meta, root)
    p.folder.mkdir(parents=True, exist_ok=True)
    lock.name(root, p.search_id)
    uri = tracking_uri(mlflow_cfg.tracking_uri, project)
    local = not (ray_cfg.address or _env_address())
    finals = search_cfg.finalists * len(search_cfg.seeds)
    fusable = (search_cfg.fuse != "false"
               and fused.refusal_of(search_cfg, train_cfg, model_cfg) is None)
    states = room.state_bytes(fusable, max(search_cfg.trials, finals), _model_source(meta),
                              p.folder / "groups")
    room.check(p.folder, search_cfg.trials + finals, local_store(uri), local,
               states)  # before the parent run opens, as a stage's preflight
    parent = story.parent_run(uri, mlflow_cfg.experiment, p.search_id,
                              {**flatten({"search": search_cfg}), "search.metric": p.metric,
                               "search.budget_steps": p.full,
                               "search.options": options or "none (params.yaml's search section)"})
    if left := endings.stale(uri, parent, p.search_id):
        print(f"[wellfed] {left} child run(s) a search killed outright left RUNNING: ended "
              "KILLED (a trial started again opens its own child again)", flush=True)
    write_json(p.folder / "search.json", {"search_id": p.search_id, "mlflow_parent": parent,
                                          "tracking_uri": uri, "metric": p.metric,
                                          "full_steps": p.full, "rungs": list(p.rungs)})
    tuning.environment()
    local_token_auth(ray_cfg)
    with daemons.daemons_apart(local=local):
        connect(ray_cfg)
    import ray

    client = mlflow.MlflowClient(uri)
    try:
        setting, need = placed(p, train_cfg, model_cfg, data_cfg, ray_cfg, tokens, meta)
        k = fused.group_size(search_cfg, setting, client, parent, p.folder)
        _say_start(search_cfg, p, parent, at_once(search_cfg, setting, need, k), options, k)
        found = (halving.search_phase(search_cfg, setting, p, uri, parent, k) if k else
                 asha.search_phase(search_cfg, setting, p, need, uri, parent))
        if found.interrupted:
            return _stopped(client, parent, found.interrupted, p)
        reports, configs = _finished(p.folder, "search")
        ranked = proof.ranked(reports, configs, p.metric, p.lower)
        if not ranked:
            raise ValueError(f"no trial of search {p.search_id} reported {p.metric}: see the "
                             f"failed child runs under MLflow parent run {parent}")
        chosen = proof.finalists(ranked, search_cfg.finalists)
        checked = (halving.proof_phase(search_cfg, setting, p, uri, parent, chosen, k) if k
                   else asha.proof_phase(search_cfg, setting, p, need, uri, parent, chosen))
        if checked.interrupted:
            return _stopped(client, parent, checked.interrupted, p)
    finally:
        ray.shutdown()
    finals = proof.groups(*_finished(p.folder, "proof"), p.metric)
    gold, row_ids = validation(tokens)
    check = proof.verdict(finals, p.metric, p.lower, p.task, tuple(meta["labels"]), gold,
                          row_ids, {})
    check["edges"] = edges.at_edges(search_cfg.dimensions(), check["winner"])
    cost = report.compute(reports, search_cfg.trials, p.full)
    cost["stopper"] = "successive halving" if k else "ASHA"  # what stopped trials early
    result = {"search_id": p.search_id, "metric": p.metric, "best_trial": ranked[0],
              "ranked": ranked, "compute": cost, "final_check": check,
              "mlflow_parent": parent}
    winner_trial = next((r for g in finals for r in g if r["recipe"] == check["winner"]
                         and r["seed"] == search_cfg.seeds[0]), None)
    trained = space.budgeted(space.applied(check["winner"], train_cfg, model_cfg)[0], p.rows,
                             p.full, search_cfg.seeds[0])
    result["winner_params"] = space.exp_params(check["winner"], trained)
    _tell(client, uri, parent, p, ranked[0], cost, check)
    if run_exp:
        result.update(_winner(project, p, result["winner_params"], winner_trial, client, parent,
                              ranked[0], cost, check))
    else:
        from wellfed.search import winner

        print("[wellfed] the winner as a DVC experiment: "
              + " ".join(winner.command(winner.exp_name(p.search_id), result["winner_params"])))
    write_json(p.folder / "result.json", result)
    client.set_terminated(parent, "FINISHED")
    return result


def at_once(cfg: SearchConfig, setting: Setting, need: dict, k: int) -> tuple[int, str]:
    """How many trials train at the same time, and why: with ASHA a trial's `need` each, as
    many as Ray fits or search.concurrent; fused (`k` per group) the groups side by side as
    search/rounds.py places them."""
    if not k:
        return console.at_once(cfg.concurrent, need, cfg.trials)
    group, _threads = fused.place_group(setting, k)
    return console.fused_at_once(k, fused.groups_at_once(group), group, cfg.concurrent,
                                 cfg.trials)


def _say_start(cfg: SearchConfig, p: Plan, parent: str, together: tuple[int, str],
               options: str, k: int = 0) -> None:
    """The start line (what, how many at once and why, where), and a resume's count of what is
    kept (fused trials, `k` per group, say their own)."""
    at, why = together
    log = console.ray_tune_to_log(p.folder)
    print(f"[wellfed] search {p.search_id}: {cfg.trials} trials, {at} at once ({why})"
          + (f", sized by {options}" if options else "") + " over "
          f"{', '.join(d.text() + ' (' + d.key + ')' for d in cfg.dimensions())}; "
          f"{p.metric} ranks them; budget {cfg.min_steps}-{p.full} steps, rungs at "
          f"{', '.join(map(str, p.rungs[:-1]))}; folder {p.folder} (Ray Tune's warnings: "
          f"{log.name}, each trial's output: {console.TRIAL_LOGS}/); MLflow parent run {parent}",
          flush=True)
    said = console.resumed(p.folder, cfg.trials, cfg.finalists * len(cfg.seeds))
    if said and not k:  # fused: halving.search_phase says it
        print(f"[wellfed] {said}", flush=True)


def placed(p: Plan, train_cfg: TrainConfig, model_cfg: ModelConfig, data_cfg: DataConfig,
           ray_cfg: RayConfig, tokens: Path, meta: dict) -> tuple[Setting, dict]:
    """What every trial shares, and what Ray gives each (after `connect`): ray.cpus_per_worker
    CPUs, and ray.gpus_per_worker of a GPU where the cluster has GPUs (ray.use_gpu)."""
    from wellfed.cluster import described, live_nodes
    from wellfed.train.run.preflight import wants_gpu

    nodes = live_nodes()
    if len(nodes) > 1 and not ray_cfg.storage_path:
        raise ValueError(f"the Ray cluster has {described(nodes)}: trials on other nodes cannot "
                         f"read this machine's {tokens}; set ray.storage_path to shared storage "
                         "(an NFS path or s3://...) so the token files are staged there once")
    use_gpu = wants_gpu(ray_cfg)
    need = tuning.resources(ray_cfg.cpus_per_worker, ray_cfg.gpus_per_worker if use_gpu else 0)
    return Setting(train_cfg, model_cfg, data_cfg, str(tokens.resolve()), _model_source(meta),
                   tuple(meta["labels"]), int(meta["pad_id"]), p.task, p.rows, p.full, p.rungs,
                   ray_cfg.cpus_per_worker, use_gpu, story.finished(p.folder),
                   *_staged(ray_cfg, tokens),
                   log_dir=str((p.folder / console.TRIAL_LOGS).resolve())), need


def _env_address() -> str:
    import os

    return os.environ.get("RAY_ADDRESS", "")


def _model_source(meta: dict) -> str:
    from wellfed.model import resolve_source

    return resolve_source(meta["model_source"])


def _staged(ray_cfg: RayConfig, tokens: Path) -> tuple[str | None, str | None]:
    """The token files staged to `ray.storage_path` for a multi-node cluster, else (None, None)."""
    if not ray_cfg.storage_path:
        return None, None
    from wellfed.data import staging
    from wellfed.train.run.runs import file_digest

    digest = file_digest([tokens / "train.arrow", tokens / "validation.arrow"])
    uri, sent = staging.upload(tokens, ray_cfg.storage_path, digest)
    print(f"[wellfed] token files {'uploaded to' if sent else 'already at'} {uri}", flush=True)
    return uri, digest


def _finished(folder: Path, phase: str) -> tuple[dict[str, list], dict[str, dict]]:
    """The phase's finished trials: (trial -> reports, trial -> config)."""
    found = story.ledger(folder, phase)
    return ({t: e["reports"] for t, e in found.items()},
            {t: e["config"] for t, e in found.items()})


def validation(tokens: Path):
    from wellfed.data.token_files import TokenFile

    val = TokenFile(tokens / "validation.arrow")
    labels = val.labels if val.labels.ndim == 1 else val.labels.argmax(-1)
    return labels.astype(int), val.row_ids


def _stopped(client, parent: str, signum: int, p: Plan) -> dict:
    client.set_terminated(parent, "KILLED")
    name = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
    print(f"[wellfed] search {p.search_id} stopped by {name}: finished trials are kept "
          f"({p.folder}); rerun `wellfed-search` to resume it into the same MLflow parent run",
          flush=True)
    return {"stopped": 128 + signum}


def _tell(client, uri: str, parent: str, p: Plan, best: dict, cost: dict, check: dict) -> None:
    text = report.describe(p.search_id, p.metric, best, cost, check)
    client.set_tag(parent, story.NOTE, text)
    client.log_batch(parent, metrics=_metrics(report.metrics(cost, best, check, p.metric)))
    print(f"[wellfed] search {p.search_id}: the winner is "
          f"{report.winner(p.metric, best, check)}", flush=True)
    print(f"[wellfed] final check: {check['text']}", flush=True)
    for line in check["edges"]:
        print(f"[wellfed] {line}", flush=True)
    print(f"[wellfed] search {p.search_id}: {cost['stopper']} stopped {cost['stopped_early']} of "
          f"{cost['trials']} trials early: {cost['steps']:,} steps"
          + (f", {cost['share_of_grid']:.0%} of the same trials at full budget"
             if cost["share_of_grid"] is not None else ""), flush=True)
    keys = sorted({k for row in [best] for k in row["recipe"]})
    print(f"[wellfed] in the MLflow UI (`make ui`), the search's trials best first: "
          f"{story.saved_view(uri, parent, p.search_id, p.metric, p.lower, keys)}",
          flush=True)


def _metrics(figures: dict) -> list:
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, 0) for k, v in figures.items()]


def _winner(project: Path, p: Plan, params: dict, trial: dict | None, client, parent: str,
            best: dict, cost: dict, check: dict) -> dict:
    from wellfed.search import winner

    name = winner.exp_name(p.search_id)
    if winner.exists(name, project):
        print(f"[wellfed] the winner's experiment {name} exists already: not run again "
              f"(`dvc exp apply {name}` puts it in the workspace)", flush=True)
        return {"winner_exp": name}
    code = winner.run(name, params, project)
    if code:
        raise ValueError(winner.failed(code, project, p.folder / "result.json"))
    out: dict = {"winner_exp": name}
    run_file = project / "data" / "train" / "run.json"
    if run_file.is_file():
        run_id = json.loads(run_file.read_text())["mlflow_run_id"]
        client.set_tag(run_id, "mlflow.parentRunId", parent)
        client.set_tag(run_id, story.SEARCH_TAG, p.search_id)
        client.set_tag(run_id, story.PHASE_TAG, "winner")
        out["winner_run"] = run_id
    same = winner.equal_learning(winner.last_validation(project / "data" / "train"), trial)
    out["equal_learning"] = same
    print(f"[wellfed] equal learning: {same['text']}", flush=True)
    client.set_tag(parent, story.NOTE, report.describe(
        p.search_id, p.metric, best, cost, check, name, out.get("winner_run"))
        + f"\n\n**Equal learning:** {same['text']}.")
    return out
