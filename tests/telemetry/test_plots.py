"""Training curves: one PNG per series the history has, none for a series it lacks."""

from __future__ import annotations

import pandas as pd

from wellfed.telemetry.plots import plot_history


def test_each_series_in_the_history_becomes_a_png(tmp_path):
    history, out = tmp_path / "history", tmp_path / "plots"
    history.mkdir()
    out.mkdir()
    pd.DataFrame({"step": range(1, 41), "loss": [1 / s for s in range(1, 41)]}).to_csv(
        history / "steps.csv", index=False)
    pd.DataFrame({"step": [20, 40], "val_accuracy": [0.7, 0.8]}).to_csv(
        history / "validation.csv", index=False)
    written = plot_history(history, out)
    assert sorted(p.name for p in written) == ["loss.png", "val_accuracy.png"]
    for path in written:
        data = path.read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 5000  # a drawn figure, not an empty one
