"""Pure preparation: clean each split, build the label <-> id map, carve a stratified validation.

Nothing is dropped silently: every removed row is counted per reason in the report, and with
`on_invalid: error` (or `on_conflict: error`) the first bad row stops the stage with its file and
row named. Leakage is counted too: duplicate texts inside a split (found and dropped, separately),
the same text with different labels, and texts shared between splits. Texts are compared with
surrounding whitespace stripped (the tokenizer sees no difference).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from wellfed.config import PrepareConfig

MISSING_LABELS = frozenset({"", "nan", "null", "none"})
"""Label spellings that mean "no label" (compared lower-case): what pandas, JSON and Python
write for a missing value."""
CROSS_SPLITS = (("validation", "train"), ("test", "train"), ("test", "validation"))
SHOWN = 5  # rows or classes a message names before "..."


@dataclass
class SplitReport:
    read_as: str = ""
    rows_read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {
        "empty_text": 0, "missing_label": 0, "duplicate": 0, "conflict": 0})
    duplicates_found: int = 0
    """Rows repeating an earlier row's text and label (the first one is not counted)."""
    conflicts: dict = field(default_factory=lambda: {"texts": 0, "rows": 0, "first_rows": []})
    """Texts that occur with more than one label, the rows holding them, and the data row
    numbers of the first few such texts."""
    labels: dict[str, int] = field(default_factory=dict)


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def _occur(n: int) -> str:
    return "occurs" if n == 1 else "occur"


def _rows(rows, total: int | None = None) -> str:
    """'3, 17, 40' or '3, 17, 40, 52, 60, ...' (data rows are 1-based, header excluded)."""
    rows = list(rows)
    more = ", ..." if (total if total is not None else len(rows)) > SHOWN else ""
    return ", ".join(str(r) for r in rows[:SHOWN]) + more


def _groups(groups: list[list], total: int) -> str:
    """Rows of the first few texts: '12/40, 51/77/90, ...'."""
    more = ", ..." if total > len(groups) else ""
    return ", ".join("/".join(map(str, g)) for g in groups) + more


def text_key(texts: pd.Series) -> pd.Series:
    return texts.str.strip()


def is_missing_label(labels: pd.Series) -> pd.Series:
    return labels.isna() | labels.fillna("").str.lower().isin(MISSING_LABELS)


def _conflicts(frame: pd.DataFrame, key: pd.Series) -> tuple[pd.Series, list[list[tuple]]]:
    """Rows whose text also occurs with another label, and (row, label) examples per text."""
    per_text = frame.groupby(key, sort=False)["label"].nunique()
    mask = key.isin(per_text.index[per_text > 1])
    examples = []
    for _, group in frame[mask].groupby(key[mask], sort=False):  # in order of first occurrence
        examples.append([(int(r) + 1, label) for r, label in zip(group["row"], group["label"])][:4])
        if len(examples) == SHOWN:
            break
    return mask, examples


def clean(frame: pd.DataFrame, where: str, cfg: PrepareConfig) -> tuple[pd.DataFrame, SplitReport]:
    """Drop (or reject) empty texts, missing labels and conflicting labels; count and
    optionally drop duplicates."""
    report = SplitReport(rows_read=len(frame))
    if frame.empty:
        raise ValueError(f"{where}: has a header but no data rows; add rows or fix the path")
    empty = frame["text"].isna() | (frame["text"].fillna("").str.strip() == "")
    missing = is_missing_label(frame["label"]) & ~empty
    for mask, reason, fix in ((empty, "empty_text", "fill in the text"),
                              (missing, "missing_label", "add the label")):
        if mask.any() and cfg.on_invalid == "error":
            row, label = frame.loc[mask, "row"].iloc[0], frame.loc[mask, "label"].iloc[0]
            written = (f"written {label!r}; " if reason == "missing_label"
                       and isinstance(label, str) else "")
            raise ValueError(f"{where}: data row {int(row) + 1} has "
                             f"{reason.replace('_', ' ')} ({written}"
                             f"{_plural(int(mask.sum()), 'such row')}); {fix}, or set "
                             f"prepare.on_invalid: skip to drop and count them")
        report.dropped[reason] = int(mask.sum())
    frame = frame[~(empty | missing)]
    key = text_key(frame["text"])

    conflict, examples = _conflicts(frame, key)
    texts = int(key[conflict].nunique())
    report.conflicts = {"texts": texts, "rows": int(conflict.sum()),
                        "first_rows": [[row for row, _ in pairs] for pairs in examples]}
    if texts and cfg.on_conflict == "error":
        shown = _groups([[f"{row} {label!r}" for row, label in pairs] for pairs in examples],
                        texts)
        raise ValueError(f"{where}: {_plural(texts, 'text')} {_occur(texts)} with different "
                         f"labels in {_plural(int(conflict.sum()), 'row')} (data rows {shown}); "
                         "fix those labels, or set prepare.on_conflict: drop to remove such "
                         "rows, or keep to train on them as they are")
    if cfg.on_conflict == "drop":
        report.dropped["conflict"] = int(conflict.sum())
        frame, key = frame[~conflict], key[~conflict]

    dup = pd.DataFrame({"key": key, "label": frame["label"]}).duplicated(keep="first")
    report.duplicates_found = int(dup.sum())
    if cfg.drop_duplicates:
        report.dropped["duplicate"] = int(dup.sum())
        frame = frame[~dup]
    report.kept = len(frame)
    if report.kept == 0:
        raise ValueError(f"{where}: no usable rows left after cleaning; check text/label columns")
    return frame.reset_index(drop=True), report


def label_names(train_labels: pd.Series, where: str) -> list[str]:
    """Stable label order: numeric order when every label is an integer, else sorted strings."""
    values = sorted(set(train_labels))
    if len(values) < 2:
        raise ValueError(f"{where}: train has a single class {values}; a classifier needs at "
                         "least two label values (check prepare.label_column)")
    try:
        return sorted(values, key=int)
    except ValueError:
        return values


def encode_labels(frame: pd.DataFrame, names: list[str], where: str) -> np.ndarray:
    ids = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(frame["label"]) - set(ids))
    if unknown:
        row = int(frame.loc[frame["label"] == unknown[0], "row"].iloc[0])
        shown = ", ".join(map(repr, names[:10])) + (f", ... ({len(names)} in all)"
                                                      if len(names) > 10 else "")
        others = f" and {_plural(len(unknown) - 1, 'other label')}" if len(unknown) > 1 else ""
        raise ValueError(f"{where}: label {unknown[0]!r} (data row {row + 1}){others} never "
                         f"occurs in train (train labels: {shown}); fix the label or add train "
                         "examples")
    return frame["label"].map(ids).to_numpy(np.int64)


def carve_validation(train: pd.DataFrame, fraction: float, seed: int,
                     where: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seeded split of train into (train, validation), stratified by label, by distinct text:
    every copy of a text lands on the same side, so validation never repeats a train text."""
    key = text_key(train["text"])
    texts = train.assign(key=key).drop_duplicates("key")  # a text's first row stands for it
    counts = texts["label"].value_counts()
    few = counts[counts < 2]
    if len(few):
        def one(label):
            rows = train.loc[train["label"] == label, "row"] + 1
            if len(rows) == 1:
                return f"{label!r} (1 row: data row {_rows(rows)})"
            return f"{label!r} ({len(rows)} rows, all the same text: data rows {_rows(rows)})"

        classes = ", ".join(one(label) for label in few.index[:SHOWN])
        raise ValueError(f"{where}: cannot carve a stratified validation split: "
                         f"{'class' if len(few) == 1 else 'classes'} {classes} "
                         f"{'needs' if len(few) == 1 else 'need'} at least 2 distinct texts "
                         "(one for each side); add examples, remove those rows, or provide "
                         "prepare.validation")
    n_val = int(round(len(texts) * fraction))
    if n_val < len(counts):
        need = math.ceil(len(counts) / len(texts) * 100) / 100
        while round(len(texts) * need) < len(counts):
            need = round(need + 0.01, 2)
        fix = (f"raise prepare.val_fraction to {need:g} or provide prepare.validation"
               if need < 0.5 else "provide prepare.validation or add rows")
        raise ValueError(f"{where}: cannot carve a stratified validation split: val_fraction "
                         f"{fraction:g} of {_plural(len(texts), 'distinct text')} is "
                         f"{_plural(n_val, 'validation row')}, fewer than the {len(counts)} "
                         f"classes (each needs one); {fix}")
    from sklearn.model_selection import train_test_split  # ~1-3 s to import: only when carving

    _, held = train_test_split(texts, test_size=n_val, random_state=seed, stratify=texts["label"])
    in_val = key.isin(set(held["key"]))
    return train[~in_val], train[in_val]


def label_counts(frame: pd.DataFrame, names: list[str]) -> dict[str, int]:
    counts = frame["label"].value_counts()
    return {name: int(counts.get(name, 0)) for name in names}


def cross_split_duplicates(frames: dict[str, pd.DataFrame],
                           wheres: dict[str, str]) -> tuple[dict[str, int], list[str]]:
    """Rows of a later split whose text is also in an earlier one, per pair, with warnings."""
    counts, warnings = {}, []
    for later, earlier in CROSS_SPLITS:
        if later not in frames or earlier not in frames:
            continue
        theirs = frames[earlier].assign(key=text_key(frames[earlier]["text"]))
        mine = frames[later].assign(key=text_key(frames[later]["text"]))
        shared = mine[mine["key"].isin(theirs["key"])]
        counts[f"{later}_in_{earlier}"] = len(shared)
        if len(shared):
            pairs = pd.MultiIndex.from_frame(theirs[["key", "label"]])
            differ = int((~pd.MultiIndex.from_frame(shared[["key", "label"]]).isin(pairs)).sum())
            warnings.append(
                f"{wheres[later]}: {_plural(len(shared), later + ' row')} "
                f"{'has a text' if len(shared) == 1 else 'have texts'} that {earlier} also holds "
                f"(data row{'s' if len(shared) > 1 else ''} {_rows(shared['row'] + 1)}; "
                f"{differ or 'none'} with a different label); {later} scores will be "
                "optimistic: remove them from one of the two files")
    return counts, warnings


def single_row_classes(train: pd.DataFrame, where: str) -> list[str]:
    counts = train["label"].value_counts()
    single = counts.index[counts == 1]
    if not len(single):
        return []
    rows = train.drop_duplicates("label").set_index("label")["row"] + 1
    shown = ", ".join(f"{label!r} (data row {rows[label]})" for label in single[:SHOWN])
    more = ", ..." if len(single) > SHOWN else ""
    return [f"{where}: {_plural(len(single), 'class', 'classes')} with a single train row: "
            f"{shown}{more}; a model can hardly learn a class from one example and its scores "
            "mean little: check the label's spelling, add examples, or remove the row"]


def prepare_splits(raw: dict[str, tuple[pd.DataFrame, str]], cfg: PrepareConfig):
    """raw: split -> (frame from sources, where) for train and optionally validation/test.

    Returns (splits: split -> frame with row/text/label-id columns, names, report dict).
    """
    cleaned, reports, wheres = {}, {}, {}
    warnings = [w for frame, _ in raw.values() for w in frame.attrs.get("warnings", [])]
    for split, (frame, where) in raw.items():
        cleaned[split], reports[split] = clean(frame, where, cfg)
        reports[split].read_as = frame.attrs.get("read_as", "")
        wheres[split] = where
    train_where = raw["train"][1]
    names = label_names(cleaned["train"]["label"], train_where)
    if "validation" not in cleaned:
        cleaned["train"], cleaned["validation"] = carve_validation(
            cleaned["train"], cfg.val_fraction, cfg.seed, train_where)
        reports["validation"] = SplitReport(
            read_as=f"carved from train: {cfg.val_fraction:g} of its distinct texts, stratified "
                    f"by label, seed {cfg.seed}", rows_read=0, kept=len(cleaned["validation"]))
        reports["train"].kept = len(cleaned["train"])
        wheres["validation"] = f"{train_where} (carved validation)"
    out = {}
    for split, frame in cleaned.items():
        out[split] = pd.DataFrame({"row_id": frame["row"].to_numpy(np.int64),
                                   "text": frame["text"].to_numpy(object),
                                   "label": encode_labels(frame, names, wheres[split])})
        reports[split].labels = label_counts(frame, names)
    for split, rep in reports.items():
        n = rep.conflicts["texts"]
        if n and cfg.on_conflict == "keep":
            warnings.append(f"{wheres[split]}: {_plural(n, 'text')} {_occur(n)} with different "
                            f"labels (data rows {_groups(rep.conflicts['first_rows'], n)}); kept "
                            "as they are (prepare.on_conflict: keep); set it to drop or error")
    cross, shared = cross_split_duplicates(cleaned, wheres)
    warnings += shared
    warnings += single_row_classes(cleaned["train"], train_where)
    report = {"num_labels": len(names),
              "validation_carved": int("validation" not in raw),
              "splits": {s: vars(r) for s, r in reports.items()},
              "cross_split_duplicates": cross,
              "warnings": warnings}
    return out, names, report


PLAIN_NAME = re.compile(r"[^\s,;']+")


def _counts(pairs) -> str:
    # A name with spaces or commas is quoted so that the list stays readable.
    return ", ".join(f"{k if PLAIN_NAME.fullmatch(k) else repr(k)} {v}" for k, v in pairs)


def _label_summary(labels: dict[str, int], details: str) -> str:
    """All counts for up to 10 labels; for more, the range and the extremes (77 intents on one
    line are unreadable), pointing at the report for the rest."""
    if len(labels) <= 10:
        return f"labels ({len(labels)}): {_counts(labels.items())}"
    ranked = sorted(labels.items(), key=lambda kv: (-kv[1], kv[0]))
    low, high = ranked[-1][1], ranked[0][1]
    each = _plural(low, "row") if low == high else f"{low} to {high} rows"
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
                    + f"; duplicates: {rep['duplicates_found']} found, "
                      f"{rep['dropped']['duplicate']} dropped")
            if rep["conflicts"]["texts"]:
                head += (f"; conflicting labels: {_plural(rep['conflicts']['texts'], 'text')} in "
                         f"{_plural(rep['conflicts']['rows'], 'row')}, "
                         f"{rep['dropped']['conflict']} dropped")
        lines.append(f"{head}; {_label_summary(rep['labels'], details)}")
    cross = report["cross_split_duplicates"]
    if cross:
        lines.append("prepare: rows whose text is also in another split: " + ", ".join(
            f"{k.replace('_', ' ')} {v}" for k, v in cross.items()))
    return lines
