"""The task (single-label, multi-label or regression) from train's labels, unless prepare.task
sets it: the evidence is gathered block by block, so that the task is decided on the whole
split."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wellfed.config import PrepareConfig, number
from wellfed.data.hashing import hashes, empty_int64


@dataclass
class LabelEvidence:
    """What `infer_task` looks at in train's labels (missing ones out), gathered block by block
    so that the task is decided on the whole split; label texts are kept as 64-bit hashes."""

    lists: bool = False
    """Some label is a list."""
    several: int = 0
    """Rows whose label holds the delimiter."""
    several_example: str | None = None
    parts: np.ndarray = field(default_factory=empty_int64)
    """The distinct parts of the labels that hold the delimiter."""
    alone: np.ndarray = field(default_factory=empty_int64)
    """The distinct labels that do not."""
    numbers: bool = True
    """Every label is a number."""
    fraction_example: str | None = None
    """The first label that is a number and not whole."""
    distinct: np.ndarray = field(default_factory=empty_int64)

    def add(self, labels, rows: np.ndarray, delimiter: str) -> None:
        """One block's distinct labels in order of first appearance, with their row counts."""
        parts, alone = set(), []
        for label, count in zip(labels, rows):  # per distinct label: a few for a classifier
            if isinstance(label, tuple):
                self.lists = True
                continue
            if isinstance(label, str) and delimiter in label:
                self.several += int(count)
                self.several_example = self.several_example or label
                parts.update(p.strip() for p in label.split(delimiter) if p.strip())
            else:
                alone.append(label)
            value = number(label)
            if value is None:
                self.numbers = False
            elif self.fraction_example is None and not float(value).is_integer():
                self.fraction_example = label
        self.parts = np.union1d(self.parts, hashes(list(parts)))
        self.alone = np.union1d(self.alone, hashes(alone))
        self.distinct = np.union1d(self.distinct, hashes(labels))


def infer_task(evidence: LabelEvidence, cfg: PrepareConfig) -> tuple[str, str]:
    """(task, why) from train's labels, or as prepare.task sets it."""
    if cfg.task != "auto":
        return cfg.task, "set by prepare.task"
    if len(cfg.label_columns()) > 1:
        return "regression", f"{len(cfg.label_columns())} label columns are regression targets"
    if evidence.lists:
        return "multi_label", "the labels are lists"
    d = cfg.label_delimiter
    parts = evidence.parts
    # Most parts also used alone: a list. "$5, $10"-style class names: their parts are not.
    if evidence.several and len(parts) and (len(np.intersect1d(parts, evidence.alone))
                                             >= 0.8 * len(parts)):
        return "multi_label", (f"{evidence.several} labels like {evidence.several_example!r} "
                               f"hold several {d!r}-separated labels that also occur alone")
    if evidence.numbers and evidence.fraction_example is not None:
        return "regression", ("every label is a number and some are not whole (like "
                              f"{evidence.fraction_example!r})")
    return "single_label", f"{len(evidence.distinct)} distinct labels, one per row"
