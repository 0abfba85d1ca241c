"""Training curves as PNGs (the same series `dvc plots show` draws from data/train/history)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

SERIES = [("loss", "train loss", "steps.csv"), ("val_accuracy", "validation accuracy", "validation.csv"),
          ("val_macro_f1", "validation macro-F1", "validation.csv"),
          ("val_pearson", "validation Pearson r", "validation.csv"),
          ("workers/real_tokens_per_s", "real tokens/s", "perf.csv"),
          ("workers/input_wait_share_mean", "input wait (share of step time, mean over workers)",
           "perf.csv")]


def plot_history(history_dir: Path, out_dir: Path) -> list[Path]:
    # A Figure of its own (Agg canvas), not pyplot: no global figure state, and pyplot's import
    # is ~0.3 s of every train stage.
    from matplotlib.figure import Figure

    written = []
    for column, title, name in SERIES:
        path = history_dir / name
        if not path.is_file():
            continue
        frame = pd.read_csv(path)
        if column not in frame:
            continue
        fig = Figure(figsize=(6, 3.2), dpi=110)
        ax = fig.subplots()
        ax.plot(frame["step"], frame[column], marker="o" if len(frame) < 30 else None)
        ax.set_xlabel("optimizer step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        target = out_dir / f"{column.replace('/', '_')}.png"
        fig.savefig(target, format="png")
        written.append(target)
    return written
