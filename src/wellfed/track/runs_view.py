"""Saved views of an experiment's runs table: the table opens sorted by a ranked metric, best
first, with that metric as the first column after the run's name.

MLflow 3's UI keeps a saved view (its Views menu) as an experiment tag
`mlflow.sharedViewState.<key>` whose value is `{"name", "createdAt", "updatedAt", "state"}`, the
state a JSON text of the runs page's search (sort, filter) and layout (columns, their order,
the chart view's sections); a page address with `?viewStateShareKey=<key>` on the runs tab's
address (`#/experiments/<id>/runs`; the bare experiment address redirects and drops it) opens
it, under a banner "You're viewing a shared view". Its client API cannot pick columns any other
way, and the URL alone carries only the sort. A view is saved once: one the user changed
(Views -> Override) stays theirs. MLflow 3.17's UI was checked with headless Chromium
(tests/e2e/test_ui.py).

`View` is the general part (a sweep or search parent can save one over its trials: `filter`
their rows, `ranked` their objective, `params` the knobs it varies); `headline` is the evaluate
stage's view of the pipeline's runs, without `wellfed-compare`'s runs.

`python -m wellfed.track.runs_view [TRACKING_URI]` (what `make ui` runs) saves the headline
view where an evaluated run shows its figures, brings the alias tags up to date with the
registry (an alias pointed by hand included) and prints the addresses to open. A store moved
into a team store is one line and exit 1 (track/store_move.py), so `make ui` starts no server
that would make a new, empty one in its place.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

from wellfed.track import store_move, ui_links
from wellfed.track.registry import ALIAS_TAG

TAG_PREFIX = "mlflow.sharedViewState."
"""The experiment tags MLflow's UI reads saved views from, one per key."""
KEY, NAME = "wellfed-headline", "Headline (wellfed)"
"""The headline view's key (the address's viewStateShareKey) and its name in the Views menu."""
TAG = TAG_PREFIX + KEY
SPEED = ("train/real_tokens_per_s", "train/seconds")
"""Figures shown after the evaluated ones: how fast, how long."""
COMPARISON = "wellfed.compare"
"""The run tag `wellfed-compare` sets on a run of its own (two groups of seeds compared)."""
GROUP = "wellfed.group"
"""The run tag on a search's parent and trials (`search`): not pipeline runs. Like a sweep's
parent (its tag `wellfed.sweep_parent`, track/sweeps.py), their rows have no test figures (a
row of "-" among the real runs) and they have views of their own (the sweep's parent, the
search's saved view)."""
SWEEP_PARENT = "wellfed.sweep_parent"
"""track/sweeps.py's PARENT, named here: sweeps.py is in the train stage's deps, this is not."""
NOT_COMPARISONS = f"tags.`{COMPARISON}` IS NULL"
PIPELINE_RUNS = (f"{NOT_COMPARISONS} AND tags.`{SWEEP_PARENT}` IS NULL AND tags.`{GROUP}` "
                 "IS NULL")
"""The headline view's filter, shown in the search box: pipeline runs only (a sweep's trials
and a search's winner are pipeline runs)."""
RECIPE = ("model.name", "train.lr", "train.warmup_ratio", "train.weight_decay", "train.epochs",
          "train.max_steps", "train.global_batch_size", "train.seed")
"""The params the headline view shows beside the figures: what made each run's recipe (the
search's default space included, so a search winner's experiment shows what it changed)."""
WIDTH = 110  # px per figure column: `0.9512` and its header fit; the UI's default is 150


@dataclass(frozen=True)
class View:
    """A saved view of a runs table: rows sorted by `ranked`, best first, and as columns (in
    this order, after the run's name) `ranked`, `tags`, `metrics`, `params`, then MLflow's own;
    the chart view opens on a section of `ranked` (and `metrics`) charts."""

    key: str
    """The address's viewStateShareKey: letters, digits, '-' and '_'."""
    name: str
    """The name in the Views menu."""
    ranked: str
    """The metric key the rows are sorted by."""
    higher_is_better: bool = True
    metrics: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    filter: str = ""
    """An MLflow runs filter (`tags.x = 'y'`, `params.lr > ...`), shown in the search box."""
    models: bool = True
    """Whether to show the Models column (each run's logged model and registered version)."""

    def columns(self) -> list[str]:
        return ([f"metrics.`{self.ranked}`", *(f"tags.`{t}`" for t in self.tags)]
                + [f"metrics.`{m}`" for m in self.metrics if m != self.ranked]
                + [f"params.`{p}`" for p in self.params]
                + (["attributes.`Models`"] if self.models else []))

    def state(self) -> dict:
        """The runs page's state as the UI saves it (the fields it reads back; others keep the
        UI's defaults)."""
        columns = self.columns()
        section = f"{self.key}-section"
        charts = [{"uuid": f"{self.key}-{i}", "type": "BAR", "runsCountToCompare": 10,
                   "metricSectionId": section, "deleted": False, "isGenerated": False,
                   "metricKey": key}
                  for i, key in enumerate(dict.fromkeys([self.ranked, *self.metrics]))]
        return {"searchFilter": self.filter, "orderByKey": f"metrics.`{self.ranked}`",
                "orderByAsc": not self.higher_is_better, "selectedColumns": columns,
                # ag-grid's column ids are the same keys: the ranked figure comes right after
                # the pinned run name, before MLflow's Created, Duration, Source... columns.
                "columnOrder": columns,
                "columnWidths": {c: WIDTH for c in columns if c.startswith("metrics.")},
                "compareRunSections": [{"uuid": section, "name": f"{self.name}: {self.ranked}",
                                        "display": True, "isReordered": True, "deleted": False,
                                        "isGenerated": False}],
                "compareRunCharts": charts, "isAccordionReordered": True}

    def envelope(self, now_ms: int) -> str:
        """The experiment tag's value."""
        return json.dumps({"name": self.name, "createdAt": now_ms, "updatedAt": now_ms,
                           "state": json.dumps(self.state())})


def save(uri: str, experiment_id: str, view: View) -> bool:
    """Save `view` on the experiment unless one with its key is there (the user's, if they
    overrode it); return whether it was written now."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    if TAG_PREFIX + view.key in client.get_experiment(experiment_id).tags:
        return False
    client.set_experiment_tag(experiment_id, TAG_PREFIX + view.key,
                              view.envelope(int(time.time() * 1000)))
    return True


def address(uri: str, experiment_id: str, view: View) -> str:
    """The runs table's address, opened in `view`."""
    return ui_links.experiment(uri, experiment_id, view.key)


def headline(figures: list[str]) -> View:
    """The pipeline's view: the evaluated figures (`figures`, eval/* keys), the ranked one
    first (registry.headline), the alias column, speed, the recipe's params, the Models
    column; no comparisons, no sweep or search parents or search trials."""
    ranked, *rest = ranked_first(figures)
    return View(KEY, NAME, ranked, metrics=(*rest, *SPEED), params=RECIPE, tags=(ALIAS_TAG,),
                filter=PIPELINE_RUNS)


def ranked_first(figures: list[str]) -> list[str]:
    """The evaluated figures with the one runs are ranked by first (registry.headline)."""
    from wellfed.track.registry import headline as ranked_by

    ranked = [ranked_by(task) for task in ("single_label", "regression")]
    first = [k for k in ranked if k in figures][:1]
    return first + sorted(k for k in figures if k not in first)


def addresses(uri: str) -> list[str]:
    """Lines to print: each experiment's runs table (in the headline view where an evaluated
    run gives its figures), then the registered models."""
    import mlflow

    from wellfed.track.registry import mark_aliases

    client = mlflow.MlflowClient(uri)
    mark_aliases(uri)
    lines = []
    for exp in client.search_experiments():
        runs = client.search_runs([exp.experiment_id], NOT_COMPARISONS, max_results=200,
                                  order_by=["attributes.start_time DESC"])
        if not runs:
            continue
        evaluated = next((r for r in runs if any(k.startswith("eval/") for k in r.data.metrics)),
                         None)
        if evaluated is None and TAG not in exp.tags:
            lines.append(f"runs of {exp.name!r}: {ui_links.experiment(uri, exp.experiment_id)}")
            continue
        view = headline([k for k in evaluated.data.metrics if k.startswith("eval/")]) \
            if evaluated else None
        if view:
            save(uri, exp.experiment_id, view)
        lines.append(f"runs of {exp.name!r}" + (f" (best {view.ranked} first)" if view else "")
                     + f": {ui_links.experiment(uri, exp.experiment_id, KEY)}")
    lines.append(f"registered models (@champion: the best on the test split): "
                 f"{ui_links.models(uri)}")
    return lines


def main(argv: list[str] | None = None) -> None:
    from pathlib import Path

    from wellfed.use.registered import store_uri

    argv = sys.argv[1:] if argv is None else argv
    try:
        uri = store_move.checked(argv[0]) if argv else store_uri(Path.cwd())
    except ValueError as err:  # moved into a team store
        sys.exit(f"error: {err}")
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        print(f"no runs yet in {uri} (`make run` makes some); the UI: "
              f"{ui_links.base(uri)}/#/experiments?{ui_links.VIEW}")
        return
    for line in addresses(uri):
        print(line)


if __name__ == "__main__":
    main()
