"""MLflow tells a search's story: one parent run per search, each trial a child run with its
recipe, its curve, the rung it stopped at and why.

`Story` is a Ray Tune callback on the driver (Rank 0 logic lives in the sinks: trials only
report). It opens a trial's child run when Tune starts the trial, logs each report at its step,
mirrors ASHA's decisions (search/rungs.py), and closes the child with its outcome. A finished
trial's reports are also written to the search folder (`finished/<trial id>.json`): a resumed
search hands them back to Tune instead of training the trial again (search/trial.py), found by
its trial id or, in a phase started afresh under new ids, by its config. A trial cut off by a
kill restarts from its first step into the same child run; steps the child holds already are
not logged again (the same seed and batches give the same values).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from wellfed.outputs import write_json
from wellfed.search import space
from wellfed.search.rungs import Rungs
from wellfed.track.runs_view import GROUP
from wellfed.track.tracking import EXPERIMENT_KIND

SEARCH_TAG = "wellfed.search"
"""On the parent and every child: the search's id."""
TRIAL_TAG = "wellfed.search.trial"
PHASE_TAG = "wellfed.search.phase"
OUTCOME_TAG = "wellfed.search.outcome"
STOP_TAG = "wellfed.search.stop"
"""A trial's end in a few words, the search view's first column: `completed 188 steps`, or
`stopped at step 16: 0.5123 < 0.5480` (its figure, then ASHA's cutoff); the outcome tag says
it in full."""
RECIPE_TAG = "wellfed.search.recipe"
NOTE = "mlflow.note.content"


def named(trial: str, config: dict) -> str:
    """A trial as the console and MLflow name it: a search trial by its id (`trial 4fd73c57`),
    a final-check run by what it is (`finalist 1, seed 2`): Tune's ids for the final check's
    grid (`ccce9_00000`) are its own bookkeeping (the ledger, the child run's tag)."""
    proof = config.get("proof")
    if proof is None:
        return f"trial {trial}"
    return f"finalist {int(proof['finalist']) + 1}, seed {proof['seed']}"


def parent_run(uri: str, experiment: str, search_id: str, params: dict) -> str:
    """The search's parent run: found by its tag (a resumed search goes on in it) or made."""
    import mlflow

    from wellfed.track.tracking import store_lock

    with store_lock(uri):
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(
            experiment, tags=dict([EXPERIMENT_KIND]))
        found = client.search_runs([exp_id], f"tags.`{SEARCH_TAG}` = '{search_id}' and "
                                   f"tags.`{PHASE_TAG}` = 'parent'", max_results=1)
        if found:
            client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id
        run = client.create_run(exp_id, run_name=f"search {search_id}",
                                tags={SEARCH_TAG: search_id, PHASE_TAG: "parent",
                                      GROUP: "search"})
        client.log_batch(run.info.run_id, params=_params(params))
        return run.info.run_id


def _params(params: dict) -> list:
    from mlflow.entities import Param

    return [Param(k, str(v)[:6000]) for k, v in params.items()]


class Story:
    """The Tune callback (ray.tune.Callback's hooks; `callback()` makes the Tune object)."""

    def __init__(self, uri: str, parent: str, search_id: str, phase: str, folder: Path,
                 metric: str, rungs: Rungs, full: int, total: int = 0):
        import mlflow

        self.client = mlflow.MlflowClient(uri)
        self.experiment = self.client.get_run(parent).info.experiment_id
        self.parent, self.search_id, self.phase = parent, search_id, phase
        self.folder, self.metric, self.rungs, self.full = folder, metric, rungs, full
        self.runs: dict[str, str] = {}
        self.configs: dict[str, dict] = {}
        self.replayed: set[str] = set()
        self.logged: dict[str, int] = {}
        self.reports: dict[str, list] = {}
        self.started: dict[str, float] = {}
        self.walls: dict[str, float] = {}
        self.total, self.begun, self.done_before = total, time.time(), None
        self.label = "final check" if phase == "proof" else phase
        (folder / "finished").mkdir(parents=True, exist_ok=True)
        state = folder / f"rungs-{phase}.json"
        if state.is_file():
            rungs.restore(json.loads(state.read_text()))

    def callback(self):
        from wellfed.search.tune_callback import StoryCallback

        return StoryCallback(self)

    def child(self, trial: str, config: dict) -> str:
        """The trial's child run: found by its tags (a resumed search), else made."""
        found = self.client.search_runs(
            [self.experiment], f"tags.`{SEARCH_TAG}` = '{self.search_id}' and "
            f"tags.`{TRIAL_TAG}` = '{trial}'", max_results=1) or self.cut_off(trial, config)
        if found:
            run = found[0]
            history = self.client.get_metric_history(run.info.run_id, "train/loss")
            self.logged[trial] = max((m.step for m in history), default=0)
            if run.info.status != "RUNNING":
                self.client.update_run(run.info.run_id, status="RUNNING")
            return run.info.run_id
        from wellfed.search.space import recipe_of

        recipe, seed, phase = recipe_of(config)
        name = (f"search {named(trial, config)}" if phase == "search" else
                f"final check {named(trial, config)}")
        run = self.client.create_run(
            self.experiment, run_name=f"{name}: {space.shown(recipe)}"[:250],
            tags={SEARCH_TAG: self.search_id, TRIAL_TAG: trial, PHASE_TAG: phase,
                  RECIPE_TAG: space.recipe_id(recipe), "mlflow.parentRunId": self.parent,
                  GROUP: "search"})
        params = {**recipe, "search.budget_steps": self.full}
        if seed is not None:
            params["train.seed"] = seed
        self.client.log_batch(run.info.run_id, params=_params(params))
        self.logged[trial] = 0
        return run.info.run_id

    def cut_off(self, trial: str, config: dict) -> list:
        """The child of a trial of `config` cut off before it finished, in a phase that started
        afresh (new trial ids): the trial started again goes on in it, under its new id."""
        from wellfed.search.space import recipe_of

        recipe, seed, phase = recipe_of(config)
        query = (f"tags.`{SEARCH_TAG}` = '{self.search_id}' and tags.`{PHASE_TAG}` = '{phase}' "
                 f"and tags.`{RECIPE_TAG}` = '{space.recipe_id(recipe)}' and "
                 "attributes.status != 'FINISHED'")
        if seed is not None:
            query += f" and params.`train.seed` = '{seed}'"
        found = self.client.search_runs([self.experiment], query, max_results=1)
        if found:
            self.client.set_tag(found[0].info.run_id, TRIAL_TAG, trial)
        return found

    def start(self, trial: str, config: dict, by_config: bool = True) -> None:
        """A trial begins (Tune's hook). `by_config` False: a trial is known by its id alone
        (a fused search numbers its trials itself: a recipe TPE proposes twice is two)."""
        self.started[trial] = time.time()
        self.configs[trial] = config
        known = trial
        if (self.folder / "finished" / f"{trial}.json").is_file():
            self.replayed.add(trial)  # finished before a kill: Tune gets its reports back
        elif by_config and (known := self.recorded(config) or trial) != trial:
            self.replayed.add(trial)  # the same, under the id of a phase started afresh
        self.runs[trial] = self.child(known, config)
        self.logged[trial] = self.logged.pop(known, 0)
        self.reports.setdefault(trial, [])
        from wellfed.search.space import recipe_of

        said = ("finished before the search was stopped: its reports handed back, not trained "
                "again" if trial in self.replayed else space.shown(recipe_of(config)[0]))
        print(f"[wellfed] {self.label} {named(trial, config)} started: {said}", flush=True)

    def recorded(self, config: dict) -> str | None:
        """The id under which this phase's ledger holds a trial of `config`, if any."""
        from wellfed.search.space import config_key

        key = config_key(config)
        return next((t for t, e in ledger(self.folder, self.phase).items()
                     if config_key(e["config"]) == key), None)

    def result(self, trial: str, result: dict) -> None:
        from mlflow.entities import Metric

        if "step" not in result or self.metric not in result:
            return  # Tune's own bookkeeping results (a function's last, duplicated)
        report = {k: v for k, v in result.items() if k.startswith("val/") or k in (
            "step", "trial_s", "loss", "records", "timing", "predicted", "phase", "seed")}
        self.reports[trial].append(report)
        step, now = int(result["step"]), int(time.time() * 1000)
        decided = self.rungs.observe(trial, step, float(result[self.metric]), self.metric)
        write_json(self.folder / f"rungs-{self.phase}.json", self.rungs.state())
        if step <= self.logged.get(trial, 0):
            return  # logged before a restart: the same values
        name = named(trial, self.configs.get(trial, {}))
        if trial in self.replayed:
            pass  # handed back: said once when it started
        elif decided:  # ASHA's decision at a rung
            print(f"[wellfed] {self.label} {name} at {decided}", flush=True)
        elif step < self.full:  # a final-check run validates at the rungs too
            print(f"[wellfed] {self.label} {name} at step {step} of {self.full}: {self.metric} "
                  f"{float(result[self.metric]):.4f}", flush=True)
        metrics = [Metric(k, float(v), now, step) for k, v in report.items()
                   if k.startswith("val/")]
        metrics += [Metric("train/loss", float(loss), now, int(s))
                    for s, loss, _ in report.get("records", []) if s > self.logged[trial]]
        self.client.log_batch(self.runs[trial], metrics=metrics)
        self.logged[trial] = step

    def outcome(self, trial: str) -> str:
        reports = self.reports.get(trial) or [{}]
        step = int(reports[-1].get("step", 0))
        said = self.rungs.said.get(trial, "")
        if step >= self.full:
            return f"completed its full budget of {self.full} steps"
        if said.startswith("stopped"):
            return said
        return f"stopped by ASHA at step {step} of {self.full}"

    def complete(self, trial: str) -> None:
        reports = self.reports.get(trial, [])
        self.walls[trial] = time.time() - self.started.get(trial, time.time())
        if trial not in self.replayed:  # a replay keeps what the trial itself recorded
            write_json(self.folder / "finished" / f"{trial}.json",
                       {"phase": self.phase, "config": self.configs.get(trial, {}),
                        "reports": reports, "wall_s": round(self.walls[trial], 3)})
        outcome = self.outcome(trial)
        last = reports[-1] if reports else {}
        step = int(last.get("step", 0))
        stop = (f"completed {step} steps" if step >= self.full else
                self.rungs.short.get(trial, f"stopped at step {step}"))
        tags = {OUTCOME_TAG: outcome, STOP_TAG: stop, NOTE: f"{self.label} "
                f"{named(trial, self.configs.get(trial, {}))}: {outcome}; "
                f"{self.metric} {last.get(self.metric, float('nan')):.4f} at step "
                f"{last.get('step', 0)}"}
        self.client.log_batch(self.runs[trial], tags=_tags(tags))
        self.client.set_terminated(self.runs[trial], "FINISHED")
        self.progress(trial, last)

    def progress(self, trial: str, last: dict) -> None:
        """One line per finished trial: how far the phase is, this trial's end, the best yet."""
        entries = ledger(self.folder, self.phase)
        if self.done_before is None:  # finished by an earlier process: not in this one's rate
            self.done_before = len(entries) - 1
        count, here = len(entries), len(entries) - self.done_before
        elapsed = time.time() - self.begun
        left = (f", ~{elapsed / here * (self.total - count) / 60:.1f} min left"
                if self.total > count and here else "")
        scored = [(e["reports"][-1][self.metric], t) for t, e in entries.items()
                  if e["reports"] and self.metric in e["reports"][-1]
                  and int(e["reports"][-1]["step"]) >= self.full]
        lower = self.rungs.lower_is_better
        best = (min if lower else max)(scored) if scored else None
        step = int(last.get("step", 0))
        rung = self.rungs.rung_of.get(trial)
        how = ("successive halving" if self.rungs.said.get(trial, "").startswith(
            "stopped by successive halving") else "ASHA")
        end = (f"completed {step} steps" if step >= self.full else
               f"stopped by {how} at {rung}" if rung else f"stopped at step {step}")
        if trial in self.replayed:
            end += " (finished before the search was stopped: its reports handed back, not trained again)"
        shown = f"; best at full budget {best[0]:.4f} (trial {best[1]})" if best and \
            self.phase == "search" else ""
        print(f"[wellfed] {self.label} {count}/{max(self.total, count)} ({elapsed / 60:.1f} min"
              f"{left}): {named(trial, self.configs.get(trial, {}))} {end}, {self.metric} "
              f"{last.get(self.metric, float('nan')):.4f}" + shown, flush=True)

    def error(self, trial: str, where: str) -> None:
        if trial in self.runs:
            self.client.log_batch(self.runs[trial], tags=_tags(
                {OUTCOME_TAG: f"failed (Ray Tune's error file: {where or 'none'})"}))
            self.client.set_terminated(self.runs[trial], "FAILED")

    def interrupted(self) -> None:
        """The search stopped (a signal): open children end KILLED, resumable."""
        for trial, run in self.runs.items():
            if not (self.folder / "finished" / f"{trial}.json").is_file():
                self.client.set_terminated(run, "KILLED")


def saved_view(uri: str, parent: str, search_id: str, metric: str, lower: bool,
               keys: list[str]) -> str:
    """A saved view of the runs table (track/runs_view.py) that opens on this search: its runs
    only, trials best first by `metric`, their outcome and the searched params beside it.
    Returns its address."""
    import mlflow

    from wellfed.track import runs_view

    experiment = mlflow.MlflowClient(uri).get_run(parent).info.experiment_id
    view = runs_view.View(f"wellfed-{search_id}", f"search {search_id} (wellfed)", metric,
                          higher_is_better=not lower, metrics=("train/loss",),
                          params=tuple(keys), tags=(STOP_TAG, PHASE_TAG, OUTCOME_TAG),
                          filter=f"tags.`{SEARCH_TAG}` = '{search_id}'", models=False)
    runs_view.save(uri, experiment, view)
    return runs_view.address(uri, experiment, view)


def _tags(tags: dict) -> list:
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)) for k, v in tags.items()]


def ledger(folder: Path, phase: str | None = None) -> dict[str, dict]:
    """trial id -> {phase, config, reports, wall_s} of every trial the search finished (of
    `phase` only, when given)."""
    out = {}
    for path in sorted((folder / "finished").glob("*.json")):
        entry = json.loads(path.read_text(encoding="utf-8"))
        if phase is None or entry["phase"] == phase:
            out[path.stem] = entry
    return out


def finished(folder: Path) -> dict[str, list]:
    """trial id, and its config (trial.config_key) -> its recorded reports (what a resumed
    search hands back to Tune)."""
    from wellfed.search.space import config_key

    found = ledger(folder)
    return {**{config_key(e["config"]): e["reports"] for e in found.values()},
            **{t: e["reports"] for t, e in found.items()}}
