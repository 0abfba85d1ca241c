"""A registered model's files on this machine: `wellfed-predict models:/wellfed-classifier@champion`
predicts with the model the registry serves, not with whatever `data/model` holds (after a
`dvc exp run`, the last experiment run in the workspace).

A registry URI (`models:/<name>@<alias>` or `models:/<name>/<version>`) is looked up in the
MLflow store `store_uri` names, the one the stages and `wellfed-compare` use. The version's
model folder (the pyfunc model's artifact `model`, a copy of the run's data/model) is read where
it lies when the artifact store is this machine's disk, else downloaded for the command.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import Iterator

from wellfed.track import store_move

MODEL_URI = re.compile(r"models:/([^/@]+)(?:@([\w-]+)|/(\d+))")
"""A registry URI: models:/<name>@<alias> or models:/<name>/<version>."""
ARTIFACT = "model"
"""The pyfunc model's artifact that holds the model folder (logged_model.log_model)."""


def store_uri(cwd: str | Path) -> str:
    """The MLflow store a command reads: $MLFLOW_TRACKING_URI, else the project's store, an
    absolute sqlite:///<cwd>/mlflow.db (as the stages make it when mlflow.tracking_uri is "");
    one line, nothing opened, when that store was moved into a team store (track/store_move.py)."""
    given = os.environ.get("MLFLOW_TRACKING_URI")
    return store_move.checked(given) if given else store_move.project_store(cwd)


def artifact_path(mlmodel: str) -> str:
    """Where, inside a logged pyfunc model, its artifact `model` lies (MLflow names the folder
    after the one it copied: artifacts/model for the train stage's data/model), from the model's
    MLmodel file (a local path or an artifact URI)."""
    from mlflow.models import Model

    artifacts = Model.load(mlmodel).flavors.get("python_function", {}).get("artifacts") or {}
    return artifacts.get(ARTIFACT, {}).get("path") or f"artifacts/{ARTIFACT}"


def logged_files(client, model_id: str | None) -> Path | None:
    """The folder on this machine holding logged model `model_id`'s model folder as it was
    given (its artifact `model`), or None: no model, MLflow unreachable, or an artifact store
    elsewhere (a tracking server's, s3://...)."""
    from urllib.parse import unquote, urlparse

    if not model_id:
        return None
    try:
        location = client.get_logged_model(model_id).artifact_location
    except Exception:  # MLflow unreachable: the caller downloads, or does without
        return None
    parsed = urlparse(location)
    root = Path(unquote(parsed.path))
    if parsed.scheme not in ("", "file") or not (root / "MLmodel").is_file():
        return None
    folder = root / artifact_path(str(root / "MLmodel"))
    return folder if (folder / "config.json").is_file() else None


@contextlib.contextmanager
def model_folder(model: str | Path, cwd: str | Path = ".") -> Iterator[tuple[Path, str]]:
    """(a model folder on this machine, what it is in words) for `model`: a folder as it is, or
    a registry URI resolved to its version's files, downloaded into a temporary folder (removed
    on exit) when they are not on this machine. A one-line FileNotFoundError when the store or
    the version is not there."""
    found = MODEL_URI.fullmatch(str(model))
    if not found:
        yield Path(model), str(model)
        return
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = store_uri(cwd)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise FileNotFoundError(f"{model}: no MLflow store at {uri}; run the pipeline here "
                                "(`dvc repro`) or set MLFLOW_TRACKING_URI to the store that "
                                "registered it")  # opening it would create an empty store
    client = mlflow.MlflowClient(uri)
    name, alias, number = found.groups()
    try:
        version = (client.get_model_version_by_alias(name, alias) if alias
                   else client.get_model_version(name, number))
    except MlflowException:
        known = sorted(m.name for m in client.search_registered_models(max_results=100))
        raise FileNotFoundError(
            f"{model}: no such registered version in {uri} (registered models: "
            f"{', '.join(known) or 'none'})" + ("; the evaluate stage sets the alias: run "
                                                "`dvc repro` first" if alias else "")) from None
    words = f"{model} (version {version.version}, MLflow run {version.run_id})"
    # A sqlite store leaves the version's model_id empty; its source is models:/<model id>.
    model_id = getattr(version, "model_id", None) or (
        version.source.removeprefix("models:/") if version.source.startswith("models:/m-")
        else None)
    local = logged_files(client, model_id)
    if local is not None:
        yield local, words
        return
    from wellfed.use.logged_model import no_artifact_progress_bar

    files = client.get_model_version_download_uri(name, version.version).rstrip("/")
    with tempfile.TemporaryDirectory(prefix="wellfed-model-") as tmp:
        with no_artifact_progress_bar():
            inside = artifact_path(mlflow.artifacts.download_artifacts(
                artifact_uri=f"{files}/MLmodel", dst_path=tmp, tracking_uri=uri))
            path = mlflow.artifacts.download_artifacts(
                artifact_uri=f"{files}/{inside}", dst_path=tmp, tracking_uri=uri)
        yield Path(path), words
