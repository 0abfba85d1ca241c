"""The evaluation's pictures: confusion matrix, reliability diagram, and regression's scatter and
residuals. matplotlib (and scikit-learn's display) are imported by the functions that draw.

Label text is shown as it is, cut to a tick's width (`tick_label`), with mathtext off.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


def plot_confusion(matrix: np.ndarray, names: list[str], path) -> None:
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [tick_label(n) for n in names]
    # Label text as it is: no mathtext, or `$5-$10` renders as math and `$\x$` stops the stage.
    with matplotlib.rc_context({"text.parse_math": False}), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, ax = plt.subplots(figsize=(2 + 0.6 * len(names), 1.6 + 0.6 * len(names)), dpi=120)
        draw_matrix(ax, matrix, labels)
        ax.set_title("confusion matrix")
        fig.savefig(path, format="png", bbox_inches="tight")  # long labels widen the image
        plt.close(fig)
    missing = {str(w.message) for w in caught if "missing from font" in str(w.message)}
    if missing:  # matplotlib warns once per character per draw: say it once
        log.warning("%s: %d label character(s) have no glyph in matplotlib's font and show as boxes "
                    "(labels.json and predictions.parquet hold the text)", path, len(missing))
    for w in caught:
        if str(w.message) not in missing:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def draw_matrix(ax, matrix: np.ndarray, labels: list[str]) -> None:
    """Counts as shaded cells with their numbers, gold down the side and predictions along the
    bottom (scikit-learn's ConfusionMatrixDisplay look, without its ~0.7 s import)."""
    ax.imshow(matrix, cmap="Blues", interpolation="nearest")
    dark = (matrix.max() + matrix.min()) / 2.0  # numbers on the darker half are written white
    for (i, j), count in np.ndenumerate(matrix):
        ax.text(j, i, str(count), ha="center", va="center",
                color="white" if count > dark else "black")
    ticks = np.arange(len(labels))
    ax.set_xticks(ticks, labels, rotation="vertical" if max(map(len, labels), default=0) > 7
                  else "horizontal")  # a 0.6-inch column holds ~7 characters
    ax.set_yticks(ticks, labels)
    ax.set_xlabel("Predicted label")
    ax.set_ylabel("True label")


def tick_label(name, chars: int = 30) -> str:
    """A label as a tick: its own text, cut to `chars` characters (the full text is in the data)."""
    text = str(name)
    return text if len(text) <= chars else text[:chars - 1] + "…"


def plot_scatter(gold: np.ndarray, values: np.ndarray, names: list[str], path) -> None:
    """Regression: predicted against gold per target, with the diagonal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"text.parse_math": False}):
        fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 4), dpi=110,
                                 squeeze=False)
        for ax, g, v, name in zip(axes[0], gold.T, values.T, names):
            ax.scatter(g, v, s=4, alpha=0.4)
            low, high = float(min(g.min(), v.min())), float(max(g.max(), v.max()))
            ax.plot([low, high], [low, high], color="grey", lw=1)
            ax.set_xlabel(f"gold {tick_label(name)}")
            ax.set_ylabel("predicted")
        fig.suptitle("predicted vs gold")
        fig.savefig(path, format="png", bbox_inches="tight")
        plt.close(fig)


def plot_reliability(table: dict, ece: float, path) -> None:
    """Accuracy against confidence per bin with the diagonal (perfect calibration) above, the
    rows per bin as a histogram below: bars under the diagonal are overconfident bins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = np.asarray(table["edges"])
    width, left = np.diff(edges), edges[:-1]
    seen = [a is not None for a in table["accuracy"]]
    accuracy = np.array([a if a is not None else 0.0 for a in table["accuracy"]])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 6), dpi=110, sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.bar(left[seen], accuracy[seen], width=width[seen], align="edge", edgecolor="black",
            color="tab:blue", alpha=0.8, label="accuracy in bin")
    top.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="perfectly calibrated")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_ylabel("accuracy" if "top-class" in table["confidence"] else "share positive")
    top.set_title(f"reliability ({table['bins']} bins): ECE {ece:.4f}")
    top.legend(loc="upper left")
    bottom.bar(left, table["count"], width=width, align="edge", edgecolor="black", color="grey")
    bottom.set_ylabel("rows" if "top-class" in table["confidence"] else "row x label")
    bottom.set_xlabel(f"confidence ({table['confidence']})")
    fig.savefig(path, format="png", bbox_inches="tight")
    plt.close(fig)


def plot_residuals(gold: np.ndarray, values: np.ndarray, names: list[str], path) -> None:
    """Regression's stand-in for the reliability plot (it has no probabilities to calibrate):
    the residuals, predicted - gold, per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"text.parse_math": False}):
        fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.2), dpi=110,
                                 squeeze=False)
        for ax, g, v, name in zip(axes[0], gold.T, values.T, names):
            ax.hist(v - g, bins=40)
            ax.axvline(0, color="grey", lw=1)
            ax.set_xlabel(f"predicted - gold ({tick_label(name)})")
        fig.suptitle("residuals (regression: no probabilities to calibrate)")
        fig.savefig(path, format="png", bbox_inches="tight")
        plt.close(fig)
