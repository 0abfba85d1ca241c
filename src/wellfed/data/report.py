"""The data report: what each split read, kept and dropped, and its console summary."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from wellfed.data.wording import plural


@dataclass
class SplitReport:
    read_as: str = ""
    rows_read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {
        "empty_text": 0, "missing_label": 0, "duplicate": 0, "conflict": 0})
    missing_labels: dict[str, int] = field(default_factory=dict)
    """Rows dropped for a missing label, by the label as written (prepare.missing_labels)."""
    nul_texts: int = 0
    """Rows read whose text (or second text) holds a NUL byte, kept as written (warned about
    with the first one's row)."""
    duplicates_found: int = 0
    """Rows repeating an earlier row's text and label (the first one is not counted)."""
    conflicts: dict = field(default_factory=lambda: {"texts": 0, "rows": 0, "first_rows": []})
    """Texts that occur with more than one label, the rows holding them, and the data row
    numbers of the first few such texts."""
    labels: dict[str, int] = field(default_factory=dict)


PLAIN_NAME = re.compile(r"[^\s,;']+")


def _counts(pairs) -> str:
    # A name with spaces or commas is quoted so that the list stays readable.
    return ", ".join(f"{k if PLAIN_NAME.fullmatch(k) else repr(k)} {v}" for k, v in pairs)


def _label_summary(labels: dict, details: str) -> str:
    """All counts for up to 10 labels; for more, the range and the extremes (77 intents on one
    line are unreadable), pointing at the report for the rest. Regression: each target's spread."""
    if labels and isinstance(next(iter(labels.values())), dict):
        return "targets: " + ", ".join(
            f"{name} mean {v['mean']:g} sd {v['sd']:g} ({v['min']:g} to {v['max']:g})"
            for name, v in labels.items())
    if len(labels) <= 10:
        return f"labels ({len(labels)}): {_counts(labels.items())}"
    ranked = sorted(labels.items(), key=lambda kv: (-kv[1], kv[0]))
    low, high = ranked[-1][1], ranked[0][1]
    each = plural(low, "row") if low == high else f"{low} to {high} rows"
    return (f"labels ({len(labels)}): {each} each (most: {_counts(ranked[:3])}; fewest: "
            f"{_counts(ranked[-3:])}); every count is in {details}")


def summary(report: dict, details: str) -> list[str]:
    """Console lines for the prepare stage: what was read, kept and dropped, per split.
    `details` names the report file the full figures are in."""
    lines = []
    for split, rep in report["splits"].items():
        dropped = sum(rep["dropped"].values())
        reasons = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in rep["dropped"].items() if v)
        if rep["rows_read"] == 0:  # the carved validation
            head = f"prepare {split}: {rep['kept']} rows {rep['read_as']}"
        else:
            head = (f"prepare {split}: {rep['rows_read']} rows read as {rep['read_as']}; kept "
                    f"{rep['kept']}, dropped {dropped}" + (f" ({reasons})" if reasons else "")
                    + (f"; {plural(rep['nul_texts'], 'text')} "
                       f"{'holds' if rep['nul_texts'] == 1 else 'hold'} a NUL byte (kept)"
                       if rep.get("nul_texts") else "")
                    + f"; duplicates: {rep['duplicates_found']} found, "
                      f"{rep['dropped']['duplicate']} dropped")
            if rep["conflicts"]["texts"]:
                head += (f"; conflicting labels: {plural(rep['conflicts']['texts'], 'text')} in "
                         f"{plural(rep['conflicts']['rows'], 'row')}, "
                         f"{rep['dropped']['conflict']} dropped")
        lines.append(f"{head}; {_label_summary(rep['labels'], details)}")
    cross = report["cross_split_duplicates"]
    if cross:
        lines.append("prepare: rows whose text is also in another split: " + ", ".join(
            f"{k.replace('_', ' ')} {v}" for k, v in cross.items()))
    lines.append(f"prepare: task {report['task']}"
                 + (" on sentence pairs" if report.get("pair") else "")
                 + f" ({report['task_reason']})"
                 + ("; set prepare.task to choose another" if report["task_reason"] !=
                    "set by prepare.task" else ""))
    return lines
