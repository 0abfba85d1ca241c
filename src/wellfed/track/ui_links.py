"""Addresses of MLflow UI pages that open in its training view, for what wellfed prints.

MLflow 3's UI has two views: GenAI (traces, evaluations) and Model training (runs, metrics,
models). Its sidebar switch follows the page address's `workflowType=machine_learning`, else the
browser's last choice, else GenAI, whatever the experiment's own kind tag says; so every link
carries it, inside the `#/...` route, where the UI's router reads its query. A sqlite store has
no server: its links point at `make ui` (http://127.0.0.1:5000); an http(s) tracking URI is the
UI itself.
"""

from __future__ import annotations

import socket
from urllib.parse import quote, urlsplit

LOCAL_UI = "http://127.0.0.1:5000"
"""Where `make ui` serves the project's store."""
VIEW = "workflowType=machine_learning"


def base(tracking_uri: str) -> str:
    """The UI's address for this store: the server itself, or `make ui`'s."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return LOCAL_UI


def experiment(tracking_uri: str, experiment_id: str, saved_view: str | None = None) -> str:
    """The experiment's runs table; with `saved_view`, opened as that saved view has it (its
    columns and order: wellfed.track.runs_view). The runs tab's own address: MLflow 3.17's UI
    redirects `#/experiments/<id>` there and drops the saved view on the way."""
    shown = f"viewStateShareKey={quote(saved_view, safe='')}&" if saved_view else ""
    return f"{base(tracking_uri)}/#/experiments/{experiment_id}/runs?{shown}{VIEW}"


def models(tracking_uri: str) -> str:
    """The registered models' list, with each one's aliases (@champion)."""
    return f"{base(tracking_uri)}/#/models?{VIEW}"


def run(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """A run's page: its description (the run note) first, then params, metrics, artifacts."""
    return f"{base(tracking_uri)}/{run_route(experiment_id, run_id)}"


def run_route(experiment_id: str, run_id: str) -> str:
    """A run page's route alone (`#/experiments/...`), for links inside the UI (a sweep's
    description links its trials)."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?{VIEW}"


def model_version(tracking_uri: str, name: str, version: str | int) -> str:
    """A registered version's page: its aliases, tags (why it is or is not the champion)."""
    return f"{base(tracking_uri)}/{model_version_route(name, version)}"


def model_version_route(name: str, version: str | int) -> str:
    """The version page's route alone (`#/models/...`): a link inside the UI, such as the run
    note's, then works whatever host and port the UI is served on."""
    return f"#/models/{quote(name, safe='')}/versions/{version}?{VIEW}"


def logged_model(tracking_uri: str, experiment_id: str, model_id: str) -> str:
    """A logged model's page: its run, metrics by dataset and registered versions."""
    return f"{base(tracking_uri)}/#/experiments/{experiment_id}/models/{model_id}?{VIEW}"


def answering(address: str, timeout: float = 0.3) -> bool:
    """Whether anything accepts a connection at `address`'s host and port (a UI serving)."""
    parts = urlsplit(address)
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout):
            return True
    except OSError:
        return False


def offered(tracking_uri: str, page: str, again: bool = False) -> str:
    """`page` as a console line can offer it: as it is where a UI serves the store (the
    tracking server itself, or `make ui` already running), else with how to start one, for a
    link nothing answers is no link. `again`: a line before it said so already (evaluate's run
    link, before a sweep trial's summary line), so a few words, not the sentence twice."""
    if tracking_uri.startswith(("http://", "https://")) or answering(LOCAL_UI):
        return page
    if again:
        return f"{page} (after `make ui`)"
    return f"no UI is running: `make ui` serves the store at {LOCAL_UI}, then open {page}"
