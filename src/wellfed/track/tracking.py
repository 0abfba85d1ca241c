"""MLflow run lifecycle and driver-side logging of every worker's reports.

One MLflow run per pipeline run: the train stage opens it and writes its id to a small file that
evaluate reads to append its own metrics. Workers never talk to MLflow; the Ray Train controller
calls `wellfed.train.outputs.callback.MlflowCallback.after_report` with every worker's metrics,
and it logs them at their steps through the helpers here.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from typing import Any

from wellfed.track import store_move, stores
from wellfed.track.provenance import scrub

try:
    import fcntl
except ImportError:  # Windows: no lock (sweeps of parallel trials there need a server store)
    fcntl = None

def tracking_uri(configured: str, project_root: str | Path) -> str:
    """$MLFLOW_TRACKING_URI, else params, else an absolute sqlite URI (Ray workers run elsewhere)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or configured
    if uri:
        return store_move.checked(uri)
    root = Path(os.environ.get("DVC_ROOT") or project_root).resolve()
    # A queued `dvc exp run` runs in a temporary copy at <project>/.dvc/tmp/exps/<name>, without
    # git-ignored files: its store would vanish with the copy, so it is the project's store.
    parts = root.parts
    for i in range(len(parts) - 2):
        if parts[i:i + 3] == (".dvc", "tmp", "exps"):
            root = Path(*parts[:i])
            break
    return store_move.project_store(root)


def local_store(uri: str) -> Path | None:
    """The folder on this machine that a local store writes into (a sqlite database's folder,
    where the default artifact root `mlruns/` is made too; a file store's folder), for a
    stage's preflight; None for a tracking server or another remote store."""
    from urllib.parse import unquote, urlparse

    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):]).parent
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path))
    return None


# The experiment's kind for MLflow 3's UI: its JS bundle (mlflow/server/js) maps
# custom_model_development to "Machine learning" (runs, metrics, models) and genai_development to
# the GenAI view (traces). MLflow 3.17's sidebar switch (GenAI | Model training) overrides the
# tag: it follows the URL's ?workflowType=machine_learning, else the browser's last choice, else
# GenAI; `make ui` prints such a link.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def start_run(uri: str, experiment: str, run_name: str, run_id: str | None = None,
              tags: dict[str, str] | None = None) -> str:
    """Create (or reopen, for a resume) the pipeline's MLflow run; return its id. The run is
    named `run_name`, or `run_name-2`, `-3`, ... when the experiment already has that name (a
    forced re-run of the same inputs). A login that may not write is one line (ValueError)."""
    try:
        with store_lock(uri):
            return open_run(uri, experiment, run_name, run_id, tags)
    except Exception as err:  # MlflowException: a team store's 401/403 (stores.write_refusal)
        if (line := stores.write_refusal(uri, experiment, str(err))) is None:
            raise
        raise ValueError(line) from None


@contextlib.contextmanager
def store_lock(uri: str):
    """Hold a local sqlite store's lock file (`mlflow.db.lock`) while its run is opened.

    MLflow creates and migrates the tables on the store's first use, and makes the experiment on
    its first run. Four sweep trials starting on a fresh store at once all failed: "table runs
    already exists", an alembic version mismatch, "_alembic_tmp_metrics already exists". With
    the store made, four writers of 300 metric batches each lost nothing without a lock
    (tests/test_tracking.py). A server store (http://...) serialises itself."""
    if not uri.startswith("sqlite:///") or fcntl is None:
        yield
        return
    db = Path(uri[len("sqlite:///"):])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def open_run(uri: str, experiment: str, run_name: str, run_id: str | None,
             tags: dict[str, str] | None) -> str:
    import mlflow

    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    if run_id:
        try:
            client.get_run(run_id)
            return run_id
        except mlflow.exceptions.MlflowException:
            pass
    exp_id = experiment_id(client, experiment)
    return client.create_run(exp_id, run_name=unique_name(client, exp_id, run_name),
                             tags=tags or {}).info.run_id


def experiment_id(client, name: str) -> str:
    """The experiment `name`'s id, made (with its kind tag) if there is none. Trials starting
    at once on a fresh tracking server both found none and both made it: the second failed,
    RESOURCE_ALREADY_EXISTS, and its trial with it (the e2e sweep, tests/e2e/test_team.py). A
    sqlite store's lock file serialises this; a server's store has no such lock, so the loser
    of that race reads the winner's."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, tags=dict([EXPERIMENT_KIND]))
        except MlflowException as err:
            if "ALREADY_EXISTS" not in str(err) or client.get_experiment_by_name(name) is None:
                raise
            exp = client.get_experiment_by_name(name)
    if EXPERIMENT_KIND[0] not in exp.tags:  # made before wellfed set it; a user's choice stays
        client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
    return exp.experiment_id


def unique_name(client, experiment_id: str, name: str) -> str:
    """`name`, or `name-<n>` with the lowest n >= 2 no run of the experiment is called yet."""
    taken = {r.info.run_name for r in client.search_runs(
        [experiment_id], filter_string=f"attributes.run_name LIKE '{name.replace(chr(39), '_')}%'",
        max_results=1000)}
    n, out = 1, name
    while out in taken:
        n += 1
        out = f"{name}-{n}"
    return out


def log_datasets(uri: str, run_id: str, tokens_dir: Path) -> int:
    """The token files (train, validation, test) as the run's dataset inputs, for the runs
    table's Dataset column: name `tokens/<split>`, digest the file's sha256 (MLflow keeps at most
    36 characters; the profile has all 64), source the file's path, rows in the profile.
    Returns how many were logged."""
    import hashlib
    import json

    import mlflow
    import pyarrow as pa
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = []
    for split in ("train", "validation", "test"):
        path = (Path(tokens_dir) / f"{split}.arrow").resolve()
        if not path.is_file():
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        with pa.memory_map(str(path)) as source:  # mapped: counting rows reads no token
            reader = pa.ipc.open_file(source)
            rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
            schema = {"mlflow_colspec": [{"name": f.name, "type": str(f.type)}
                                         for f in reader.schema]}
        profile = {"num_rows": rows, "sha256": h.hexdigest()}
        dataset = Dataset(name=f"tokens/{split}", digest=h.hexdigest()[:36], source_type="local",
                          source=json.dumps({"uri": str(path)}), schema=json.dumps(schema),
                          profile=json.dumps(profile))
        inputs.append(DatasetInput(dataset, [InputTag("mlflow.data.context", split)]))
    mlflow.MlflowClient(uri).log_inputs(run_id, datasets=inputs)
    return len(inputs)


def log_params(uri: str, run_id: str, params: dict[str, Any], tags: dict[str, Any]) -> None:
    """`params`: the user's knobs (params.yaml), logged once (MLflow params never change), so
    the compare page's "params that differ" are choices people made. `tags`: everything else,
    derived values (`derived.*`: run key, engine, precision, ...) included, which a resume may
    update."""
    import mlflow
    from mlflow.entities import Param

    client = mlflow.MlflowClient(uri)
    existing = client.get_run(run_id).data.params
    fresh = [Param(k, str(v)[:6000]) for k, v in scrub(params).items() if k not in existing]
    for i in range(0, len(fresh), 100):
        client.log_batch(run_id, params=fresh[i:i + 100])
    set_tags(uri, run_id, tags)


def set_tags(uri: str, run_id: str, tags: dict[str, Any]) -> None:
    """Run tags (credentials scrubbed), in one request."""
    import mlflow
    from mlflow.entities import RunTag

    mlflow.MlflowClient(uri).log_batch(run_id, tags=[RunTag(k, str(v))
                                                     for k, v in scrub(tags).items()])


def send_metrics(uri: str, run_id: str, metrics: list, tags: dict[str, str] | None = None) -> None:
    """Log `Metric` entities in batches of 500 (MLflow's per-request limit is 1,000), and
    `tags` with the first batch."""
    import mlflow
    from mlflow.entities import RunTag

    client = mlflow.MlflowClient(uri)
    tagged = [RunTag(k, v) for k, v in (tags or {}).items()]
    for i in range(0, max(len(metrics), 1 if tagged else 0), 500):
        client.log_batch(run_id, metrics=metrics[i:i + 500], tags=tagged if i == 0 else [])


def log_metrics(uri: str, run_id: str, metrics: dict[str, float], model_id: str | None = None,
                dataset: tuple[str, str] | None = None) -> None:
    """Run-level figures (summaries, evaluation), logged at step 0; with `model_id` (and a
    logged `dataset` (name, digest) they were measured on) also the logged model's figures,
    which its page lists by dataset.

    Once: a stage killed after logging them and rerun (evaluate's figures of the same model are
    the same numbers) finds each already the run's value at step 0 and logs it no second time;
    a figure that changed (evaluate's code did) is logged, and the run shows the newer one."""
    import mlflow
    from mlflow.entities import Metric

    known = mlflow.MlflowClient(uri).get_run(run_id).data.metrics  # each key's latest value
    now = int(time.time() * 1000)
    name, digest = dataset or (None, None)
    send_metrics(uri, run_id, [Metric(k, float(v), now, 0, model_id=model_id, dataset_name=name,
                                      dataset_digest=digest) for k, v in metrics.items()
                               if not same_figure(known.get(k), float(v))])


def same_figure(known: float | None, value: float) -> bool:
    """Whether a run-level figure is already `value` (NaN is NaN: a rerun logs it once too)."""
    return known is not None and (known == value or (math.isnan(known) and math.isnan(value)))


def dataset_digest(uri: str, run_id: str, name: str) -> tuple[str, str] | None:
    """(name, digest) of the run's logged dataset input `name` (log_datasets), or None."""
    import mlflow

    for given in mlflow.MlflowClient(uri).get_run(run_id).inputs.dataset_inputs:
        if given.dataset.name == name:
            return name, given.dataset.digest
    return None


def log_artifacts(uri: str, run_id: str, local_dir: str | Path, artifact_path: str) -> None:
    import mlflow

    mlflow.MlflowClient(uri).log_artifacts(run_id, str(local_dir), artifact_path)


def metric_histories(uri: str, run_id: str, prefixes: tuple[str, ...],
                     since: float = 0.0) -> dict[str, list[float]]:
    """Every logged value (in step order) of the run's metrics whose key starts with `prefixes`;
    with `since` (seconds since the epoch), only values logged from then on."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    keys = [k for k in client.get_run(run_id).data.metrics if k.startswith(prefixes)]
    return {k: [m.value for m in sorted(client.get_metric_history(run_id, k),
                                        key=lambda m: (m.step, m.timestamp))
                if m.timestamp >= since * 1000]
            for k in keys}


def metric_table(uri: str, run_id: str, keys: tuple[str, ...]) -> list[dict]:
    """Rows {"step": s, key: value, ...} of the run's metrics `keys`, one per logged step."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    rows: dict[int, dict] = {}
    for key in keys:
        for m in client.get_metric_history(run_id, key):
            rows.setdefault(m.step, {"step": m.step})[key] = m.value
    return [rows[step] for step in sorted(rows)]


def log_text(uri: str, run_id: str, text: str, artifact_file: str) -> None:
    import mlflow

    mlflow.MlflowClient(uri).log_text(run_id, text, artifact_file)
