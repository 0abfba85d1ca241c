"""No run of a search is left RUNNING, however the search ends.

A signal ends the open children KILLED (story.Story.interrupted); any other way out (a full
disk, a lost Ray, a bug) ends the parent and its open children FAILED here (`ended`), and a
full or read-only folder is said in the stages' line (search/room.py); a search killed outright
(SIGKILL, a reboot: nothing runs on the way out) leaves its runs RUNNING, so the next search
of the same id ends those KILLED before it starts. Only one search runs per project
(search/lock.py), so a RUNNING child of this search's id at its start is one nobody runs.
A child the resumed search trains again is set RUNNING again when it starts (story.Story.child).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, TypeVar

from wellfed.search import lock, room

T = TypeVar("T")


def stale(uri: str, parent: str, search_id: str, status: str = "KILLED",
          children_only: bool = True) -> int:
    """End `status` the runs of `search_id` left RUNNING (by default its children only: a search
    killed outright left them); how many."""
    import mlflow

    from wellfed.search.story import SEARCH_TAG

    client = mlflow.MlflowClient(uri)
    experiment = client.get_run(parent).info.experiment_id
    left = client.search_runs([experiment], f"tags.`{SEARCH_TAG}` = '{search_id}' and "
                              "attributes.status = 'RUNNING'")
    ended = 0
    for run in left:
        if not (children_only and run.info.run_id == parent):
            client.set_terminated(run.info.run_id, status)
            ended += 1
    return ended


def ended(call: Callable[[], T], root: Path) -> T:
    """`call()` (the search), its runs ended FAILED if it raises (KILLED on Ctrl-C), and a full
    or read-only folder said in the stages' line."""
    try:
        return call()
    except BaseException as err:
        search_id = lock.current(root)
        folder = root / search_id if search_id else root
        with contextlib.suppress(Exception):  # the error under way is the one to report
            said = json.loads((folder / "search.json").read_text(encoding="utf-8"))
            stale(said["tracking_uri"], said["mlflow_parent"], search_id,
                  "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED",
                  children_only=False)
        if isinstance(err, Exception) and (fault := room.write_fault(err, folder)) is not None:
            raise fault from None
        raise
