"""The runs table's headline view: a saved view of the experiment, so that the table opens with
the evaluated figures as columns, best first, the Models column (each run's registered version)
and the run tag `wellfed.alias` (`@champion` on the champion's run: the Models column names
versions, not their aliases) beside them.

MLflow 3's UI keeps a saved view (its Views menu) as an experiment tag
`mlflow.sharedViewState.<key>` whose value is `{"name", "createdAt", "updatedAt", "state"}`, the
state a JSON text of the runs page's sort, filters and columns; a page address with
`?viewStateShareKey=<key>` on the runs tab's address (`#/experiments/<id>/runs`; the bare
experiment address redirects and drops it) opens it, under a banner "You're viewing a shared
view". Its client API cannot pick columns any other way, and the URL alone carries only the
sort. wellfed saves one such view per experiment, once: a view the user changed (Views ->
Override) stays theirs. MLflow 3.17's UI was checked with headless Chromium.

`python -m wellfed.track.runs_view [TRACKING_URI]` (what `make ui` runs) saves it where an
evaluated run shows its figures, brings the alias tags up to date with the registry (an alias
pointed by hand included) and prints the addresses to open.
"""

from __future__ import annotations

import json
import sys
import time

from wellfed.track import ui_links
from wellfed.track.registry import ALIAS_TAG

KEY = "wellfed-headline"
"""The saved view's key (the address's viewStateShareKey)."""
TAG = f"mlflow.sharedViewState.{KEY}"
"""The experiment tag MLflow's UI reads the saved view from."""
NAME = "Headline (wellfed)"
SPEED = ("train/real_tokens_per_s", "train/seconds")
"""Figures shown after the evaluated ones: how fast, how long."""


def state(figures: list[str]) -> dict:
    """The runs page's state: sorted by the first of `figures` (the task's ranked headline),
    best first, and columns for each figure, the speed, and the Models column."""
    columns = (["attributes.`Models`", f"tags.`{ALIAS_TAG}`"]
               + [f"metrics.`{k}`" for k in [*figures, *SPEED]])
    return {"orderByKey": f"metrics.`{figures[0]}`", "orderByAsc": False,
            "selectedColumns": columns}


def save(uri: str, experiment_id: str, figures: list[str]) -> bool:
    """Save the headline view on the experiment unless it has one; return whether it has one
    now. `figures`: the eval/* keys, the ranked headline first."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    if TAG in client.get_experiment(experiment_id).tags:
        return True
    if not figures:
        return False
    now = int(time.time() * 1000)
    client.set_experiment_tag(experiment_id, TAG, json.dumps(
        {"name": NAME, "createdAt": now, "updatedAt": now, "state": json.dumps(state(figures))}))
    return True


def ranked_first(figures: list[str]) -> list[str]:
    """The evaluated figures with the one runs are ranked by first (registry.headline)."""
    from wellfed.track.registry import headline

    ranked = [headline(task) for task in ("single_label", "regression")]
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
        runs = client.search_runs([exp.experiment_id], max_results=200,
                                  order_by=["attributes.start_time DESC"])
        if not runs:
            continue
        evaluated = next((r for r in runs if any(k.startswith("eval/") for k in r.data.metrics)),
                         None)
        figures = ranked_first([k for k in evaluated.data.metrics if k.startswith("eval/")]
                               if evaluated else [])
        view = KEY if save(uri, exp.experiment_id, figures) else None
        lines.append(f"runs of {exp.name!r}"
                     + (f" (best {figures[0]} first)" if view and figures else "")
                     + f": {ui_links.experiment(uri, exp.experiment_id, view)}")
    lines.append(f"registered models (@champion: the best on the test split): "
                 f"{ui_links.models(uri)}")
    return lines


def main(argv: list[str] | None = None) -> None:
    from pathlib import Path

    from wellfed.use.registered import store_uri

    argv = sys.argv[1:] if argv is None else argv
    uri = argv[0] if argv else store_uri(Path.cwd())
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        print(f"no runs yet in {uri} (`make run` makes some); the UI: "
              f"{ui_links.base(uri)}/#/experiments?{ui_links.VIEW}")
        return
    for line in addresses(uri):
        print(line)


if __name__ == "__main__":
    main()
