"""A console line offers a UI link only where a UI answers; else it says how to start one."""

from __future__ import annotations

import socket

from wellfed.track import ui_links

PAGE = "http://127.0.0.1:5000/#/experiments/1/runs/abc?workflowType=machine_learning"


def test_a_link_is_offered_as_it_is_only_where_a_ui_answers(monkeypatch):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        monkeypatch.setattr(ui_links, "LOCAL_UI", f"http://127.0.0.1:{port}")
        # nothing listens yet: the sqlite store's link needs `make ui` first
        said = ui_links.offered("sqlite:////p/mlflow.db", PAGE)
        assert said == (f"no UI is running: `make ui` serves the store at "
                        f"http://127.0.0.1:{port}, then open {PAGE}")
        # a second link on the same console (a sweep's, after the run's): not the sentence twice
        assert ui_links.offered("sqlite:////p/mlflow.db", PAGE, again=True) == \
            f"{PAGE} (after `make ui`)"
        listener.listen()
        assert ui_links.offered("sqlite:////p/mlflow.db", PAGE) == PAGE  # `make ui` is up
        assert ui_links.offered("sqlite:////p/mlflow.db", PAGE, again=True) == PAGE
    # a tracking server is its own UI: its link as it is
    assert ui_links.offered("http://mlflow-host:5000", PAGE) == PAGE
