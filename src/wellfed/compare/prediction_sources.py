"""Where a run's evaluated predictions come from, for `wellfed-compare`: a folder or file, an
MLflow run (by id, by `dvc exp` name through the tag `dvc.exp_name`, or by registry URI
`models:/<name>@<alias>` / `models:/<name>/<version>`: the run that trained that version), else a
git revision or `dvc exp` name read with dvc.api from DVC's cache. A group of runs may also be
named as `sweep:<id>`: every finished MLflow run tagged `wellfed.sweep` = <id>.

A run's predictions are its evaluate stage's `predictions.parquet` with `report.json` beside it
(task, split, label list).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from wellfed.track import store_move
from wellfed.track.sweeps import SWEEP_TAG
from wellfed.use.registered import MODEL_URI, store_uri

RUN_ID = re.compile(r"[0-9a-f]{32}")  # MLflow's run ids: uuid4 hex
SWEEP = "sweep:"
"""A group spec's prefix: `sweep:<id>` names every run of that sweep."""

log = logging.getLogger("wellfed.compare.prediction_sources")


@dataclass(frozen=True)
class Scored:
    """One run's predictions and where they came from."""

    ref: str
    """What the user named: a run id, an experiment name, a revision or a folder."""
    source: str
    """Where the predictions were read, in words."""
    frame: pd.DataFrame
    report: dict = field(default_factory=dict)
    run_id: str | None = None
    """The MLflow run, when the predictions came from one (comparisons are logged to it)."""


def default_tracking_uri(given: str | None, cwd: str | Path) -> str:
    """`given`, else $MLFLOW_TRACKING_URI, else an absolute sqlite:///<cwd>/mlflow.db; one line
    when it names a store moved into a team store (track/store_move.py)."""
    return store_move.checked(given) if given else store_uri(cwd)


def load(ref: str, tracking_uri: str, repo: str | Path, eval_dir: str = "data/eval") -> Scored:
    """The predictions `ref` names: a local folder (or .parquet file), else an MLflow run (by
    id, or tagged `dvc.exp_name` = ref), else `eval_dir` at git revision or `dvc exp` name `ref`
    in the DVC repo `repo`, read with dvc.api (DVC-cached outputs come from the cache, so
    nothing in the workspace changes). One-line FileNotFoundError naming what was tried."""
    path = Path(ref)
    if path.is_dir() and (path / "predictions.parquet").is_file():
        path = path / "predictions.parquet"
    if path.suffix == ".parquet" and path.is_file():
        report = path.parent / "report.json"
        return Scored(ref, f"the file {path}", pd.read_parquet(path),
                      json.loads(report.read_text()) if report.is_file() else {})
    tried = []
    found = from_mlflow(ref, tracking_uri, tried)
    if found is None and not MODEL_URI.fullmatch(ref):  # a registry URI is no git revision
        found = from_dvc(ref, repo, eval_dir, tried)
    if found is not None:
        return found
    raise FileNotFoundError(
        f"{ref!r}: {'; '.join(tried)}; pass an MLflow run id, a `dvc exp` name, "
        f"models:/<name>@<alias>, a git revision or a folder holding predictions.parquet")


def load_group(specs: list[str], tracking_uri: str, repo: str | Path,
               eval_dir: str = "data/eval") -> list[Scored]:
    """Every run `specs` name, in order: `sweep:<id>` is that sweep's runs (oldest first),
    anything else the one run `load` finds."""
    runs = []
    for spec in specs:
        if not spec.startswith(SWEEP):
            runs.append(load(spec, tracking_uri, repo, eval_dir))
            continue
        for run_id in sweep_runs(spec.removeprefix(SWEEP), tracking_uri):
            run = load(run_id, tracking_uri, repo, eval_dir)
            runs.append(dataclasses.replace(
                run, source=f"MLflow run {run_id} ({spec}) in {tracking_uri}"))
    return runs


def sweep_runs(sweep: str, uri: str) -> list[str]:
    """Ids of the finished MLflow runs tagged `wellfed.sweep` = `sweep`, oldest first, less any
    parent of another such run (a sweep's own summary run, which evaluated nothing). A one-line
    FileNotFoundError when there are none; a warning naming the runs left out unfinished."""
    spec = f"{SWEEP}{sweep}"
    if not sweep or "'" in sweep:  # MLflow filter strings have no escape for a quote
        raise ValueError(f"{spec!r}: a sweep id is the value of the {SWEEP_TAG} tag, not empty "
                         f"and without quotes")
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise FileNotFoundError(f"{spec}: no MLflow store at {uri} (set --tracking-uri or "
                                f"$MLFLOW_TRACKING_URI)")
    import mlflow

    client = mlflow.MlflowClient(uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(ids, f"tags.`{SWEEP_TAG}` = '{sweep}'", max_results=50000,
                               order_by=["attributes.start_time ASC"]) if ids else []
    parents = {r.data.tags.get("mlflow.parentRunId") for r in found}
    trials = [r for r in found if r.info.run_id not in parents]
    done = [r.info.run_id for r in trials if r.info.status == "FINISHED"]
    left = [f"{r.info.run_id} {r.info.status}" for r in trials if r.info.status != "FINISHED"]
    if not done:
        raise FileNotFoundError(
            f"{spec}: no finished MLflow run tagged {SWEEP_TAG}={sweep!r} in {uri}"
            f"{f' ({len(left)} not finished: {left[0]})' if left else ''}; name the sweep's id "
            f"as its trials were tagged, or list their runs")
    if left:
        log.warning("%s: left out %d unfinished runs (%s)", spec, len(left), ", ".join(left))
    return done


def from_mlflow(ref: str, uri: str, tried: list[str]) -> Scored | None:
    """The run with id `ref`, the run that trained registered version `ref`
    (models:/<name>@<alias> or models:/<name>/<version>), or the latest run tagged
    dvc.exp_name = `ref`, with its evaluate artifacts; None (and a note in `tried`) when the
    store has no such run or cannot be read."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        tried.append(f"no MLflow store at {uri} (set --tracking-uri or $MLFLOW_TRACKING_URI)")
        return None  # opening it would create an empty store in the user's folder
    import mlflow

    client = mlflow.MlflowClient(uri)
    try:
        if MODEL_URI.fullmatch(ref):
            found = registered_run(client, ref, uri, tried)
            if found is None:
                return None
            run, how = found
        elif RUN_ID.fullmatch(ref):
            try:
                run, how = client.get_run(ref), f"MLflow run {ref}"
            except mlflow.exceptions.MlflowException:
                tried.append(f"no MLflow run with that id in {uri}")
                return None
        else:
            if "'" in ref:  # MLflow filter strings have no escape for a quote
                tried.append("not an MLflow run id")
                return None
            ids = [e.experiment_id for e in client.search_experiments()]
            runs = client.search_runs(ids, f"tags.`dvc.exp_name` = '{ref}'",
                                      order_by=["attributes.start_time DESC"]) if ids else []
            if not runs:
                tried.append(f"no MLflow run tagged dvc.exp_name={ref!r} in {uri}")
                return None
            run = runs[0]
            how = (f"MLflow run {run.info.run_id} (tagged dvc.exp_name={ref!r}"
                   f"{f', latest of {len(runs)}' if len(runs) > 1 else ''})")
    except Exception as err:  # a server down or refusing: go on to dvc, say why
        tried.append(f"MLflow store {uri} unreadable ({type(err).__name__}: "
                     f"{str(err).splitlines()[0][:200] if str(err) else ''})")
        return None
    run_id = run.info.run_id
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path="eval/predictions.parquet", dst_path=tmp,
                tracking_uri=uri)
            frame = pd.read_parquet(local)
        except Exception:
            raise FileNotFoundError(
                f"{how} has no eval/predictions.parquet artifact; run the evaluate stage for it "
                f"(dvc repro) or name its data/eval folder instead") from None
        try:
            report = json.loads(Path(mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path="eval/report.json", dst_path=tmp,
                tracking_uri=uri)).read_text())
        except Exception:
            report = {}  # older runs: task and split are then taken from the predictions alone
    return Scored(ref, f"{how} in {uri}", frame, report, run_id)


def registered_run(client, ref: str, uri: str, tried: list[str]):
    """(the MLflow run behind registry URI `ref`, how it was found), or None."""
    from mlflow.exceptions import MlflowException

    name, alias, number = MODEL_URI.fullmatch(ref).groups()
    try:
        version = (client.get_model_version_by_alias(name, alias) if alias
                   else client.get_model_version(name, number))
    except MlflowException:
        tried.append(f"no registered version {ref} in {uri}" + (
            " (the evaluate stage sets the alias: run `dvc repro` first)" if alias else ""))
        return None
    return (client.get_run(version.run_id),
            f"MLflow run {version.run_id} ({ref} = version {version.version})")


def from_dvc(rev: str, repo: str | Path, eval_dir: str, tried: list[str]) -> Scored | None:
    """`eval_dir`/predictions.parquet and report.json at git revision or `dvc exp` name `rev`."""
    import dvc.api
    from dvc.exceptions import DvcException

    path = f"{eval_dir.rstrip('/')}/predictions.parquet"
    try:
        data = dvc.api.read(path, repo=str(repo), rev=rev, mode="rb")
    except DvcException as err:
        # A commit's cached outputs are here only if this clone ran or pulled them (dvc pull).
        tried.append(f"dvc could not read {path} at revision {rev!r} "
                     f"({str(err).splitlines()[0]}; the outputs of a commit made elsewhere are "
                     f"in this clone only after `dvc pull` from a remote)")
        return None
    try:
        report = json.loads(dvc.api.read(f"{eval_dir.rstrip('/')}/report.json", repo=str(repo),
                                         rev=rev))
    except (DvcException, ValueError):
        report = {}
    return Scored(rev, f"{path} at dvc revision {rev!r}", pd.read_parquet(io.BytesIO(data)),
                  report)
