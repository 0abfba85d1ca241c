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

from wellfed.config import PrepareConfig, number

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


def row_key(frame: pd.DataFrame) -> pd.Series:
    """What makes two rows the same input: the stripped text, and the pair's second text."""
    key = frame["text"].str.strip()
    if "text_pair" in frame:
        key = key + "\x1f" + frame["text_pair"].str.strip()
    return key


def is_missing_label(labels: pd.Series) -> pd.Series:
    return labels.map(lambda v: v is None or (isinstance(v, str) and v.lower() in MISSING_LABELS)
                      or (isinstance(v, float) and v != v)).astype(bool)


def infer_task(labels: pd.Series, cfg: PrepareConfig) -> tuple[str, str]:
    """(task, why) from train's labels (missing ones already out), or as prepare.task sets it."""
    if cfg.task != "auto":
        return cfg.task, "set by prepare.task"
    if len(cfg.label_columns()) > 1:
        return "regression", f"{len(cfg.label_columns())} label columns are regression targets"
    lists = labels.map(lambda v: isinstance(v, tuple))
    if lists.any():
        return "multi_label", "the labels are lists"
    d = cfg.label_delimiter
    several = labels.str.contains(d, regex=False)
    if several.any():
        alone = set(labels[~several])
        parts = {p.strip() for v in labels[several] for p in v.split(d) if p.strip()}
        # Most parts also used alone: a list. "$5, $10"-style class names: their parts are not.
        if parts and len(parts & alone) >= 0.8 * len(parts):
            return "multi_label", (f"{int(several.sum())} labels like {labels[several].iloc[0]!r} "
                                   f"hold several {d!r}-separated labels that also occur alone")
    values = labels.map(number)
    if values.notna().all() and not values.map(lambda v: float(v).is_integer()).all():
        example = labels[~values.map(lambda v: float(v).is_integer())].iloc[0]
        return "regression", f"every label is a number and some are not whole (like {example!r})"
    return "single_label", f"{labels.nunique()} distinct labels, one per row"


def normalize_labels(frame: pd.DataFrame, task: str, cfg: PrepareConfig, where: str) -> pd.DataFrame:
    """Multi-label: every label becomes a sorted tuple of distinct parts, so that duplicates and
    conflicts compare sets; a list label in a single-label or regression task is an error."""
    labels = frame["label"]
    missing = is_missing_label(labels)
    if task == "multi_label":
        def parts(v):
            if isinstance(v, tuple):
                return tuple(sorted(set(v)))
            return tuple(sorted({p.strip() for p in v.split(cfg.label_delimiter) if p.strip()}))

        return frame.assign(label=[v if m else parts(v) for v, m in zip(labels, missing)])
    lists = labels.map(lambda v: isinstance(v, tuple)) & (len(cfg.label_columns()) == 1)
    if lists.any():
        row = int(frame.loc[lists, "row"].iloc[0])
        raise ValueError(f"{where}: data row {row + 1} has a list of labels, but the task is "
                         f"{task}; set prepare.task: multi_label (or fix the label column)")
    return frame


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
    empty = pd.Series(False, index=frame.index)
    for column in ("text", "text_pair"):
        if column in frame:
            empty |= frame[column].isna() | (frame[column].fillna("").str.strip() == "")
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
    key = row_key(frame)

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


def label_names(train_labels: pd.Series, where: str, task: str = "single_label",
                targets: list | None = None) -> list[str]:
    """Stable label order: numeric order when every label is an integer, else sorted strings.
    Multi-label: every label any row holds; regression: the target column names."""
    if task == "regression":
        return [str(t) for t in targets or ["label"]]
    if task == "multi_label":
        values = sorted({p for v in train_labels for p in v})
    else:
        values = sorted(set(train_labels))
    if len(values) < 2:
        raise ValueError(f"{where}: train has a single class {values}; a classifier needs at "
                         "least two label values (check prepare.label_column)")
    try:
        return sorted(values, key=int)
    except ValueError:
        return values


def encode_labels(frame: pd.DataFrame, names: list[str], where: str,
                  task: str = "single_label") -> np.ndarray | list:
    """Single-label: class ids (int64); multi-label: a 0/1 vector per row; regression: the
    target values per row (float32 vectors)."""
    if task == "regression":
        return regression_targets(frame, names, where)
    ids = {name: i for i, name in enumerate(names)}
    seen = ({p for v in frame["label"] for p in v} if task == "multi_label"
            else set(frame["label"]))
    unknown = sorted(seen - set(ids))
    if unknown:
        holds = (frame["label"].map(lambda v: unknown[0] in v) if task == "multi_label"
                 else frame["label"] == unknown[0])
        row = int(frame.loc[holds, "row"].iloc[0])
        shown = ", ".join(map(repr, names[:10])) + (f", ... ({len(names)} in all)"
                                                      if len(names) > 10 else "")
        others = f" and {_plural(len(unknown) - 1, 'other label')}" if len(unknown) > 1 else ""
        raise ValueError(f"{where}: label {unknown[0]!r} (data row {row + 1}){others} never "
                         f"occurs in train (train labels: {shown}); fix the label or add train "
                         "examples")
    if task == "multi_label":
        hot = np.zeros((len(frame), len(names)), np.float32)
        for i, labels in enumerate(frame["label"]):
            hot[i, [ids[p] for p in labels]] = 1.0
        return list(hot)
    return frame["label"].map(ids).to_numpy(np.int64)


def regression_targets(frame: pd.DataFrame, names: list[str], where: str) -> list:
    rows = frame["label"].map(lambda v: v if isinstance(v, tuple) else (v,))
    values = rows.map(lambda parts: [number(p) for p in parts])
    bad = values.map(lambda vs: None in vs)
    if bad.any():
        at = bad.to_numpy().nonzero()[0][0]
        shown = rows.iloc[at]
        raise ValueError(f"{where}: data row {int(frame['row'].iloc[at]) + 1} has the label "
                         f"{shown[0] if len(shown) == 1 else shown!r}, not a number "
                         f"({int(bad.sum())} such row{'s' if bad.sum() > 1 else ''}); a "
                         "regression needs numeric labels: fix them, or set prepare.task")
    return list(np.asarray(values.tolist(), np.float32).reshape(len(frame), len(names)))


def carve_validation(train: pd.DataFrame, fraction: float, seed: int, where: str,
                     stratify: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seeded split of train into (train, validation) by distinct text, stratified by label
    (single-label) or at random (multi-label, regression): every copy of a text lands on the
    same side, so validation never repeats a train text."""
    key = row_key(train)
    texts = train.assign(key=key).drop_duplicates("key")  # a text's first row stands for it
    if not stratify:
        from sklearn.model_selection import train_test_split

        _, held = train_test_split(texts, test_size=max(1, int(round(len(texts) * fraction))),
                                   random_state=seed)
        in_val = key.isin(set(held["key"]))
        return train[~in_val], train[in_val]
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


def label_counts(frame: pd.DataFrame, names: list[str], task: str = "single_label",
                 encoded=None) -> dict:
    """Rows per class (multi-label: rows holding each label); regression: each target's
    mean, sd, min and max, from `encoded` (encode_labels' output for `frame`)."""
    if task == "regression":
        values = np.stack(encoded) if len(frame) else np.zeros((0, len(names)))
        return {name: {"mean": round(float(v.mean()), 4), "sd": round(float(v.std()), 4),
                       "min": float(v.min()), "max": float(v.max())}
                for name, v in zip(names, values.T)}
    if task == "multi_label":
        counts = pd.Series([p for v in frame["label"] for p in v]).value_counts()
    else:
        counts = frame["label"].value_counts()
    return {name: int(counts.get(name, 0)) for name in names}


def cross_split_duplicates(frames: dict[str, pd.DataFrame],
                           wheres: dict[str, str]) -> tuple[dict[str, int], list[str]]:
    """Rows of a later split whose text is also in an earlier one, per pair, with warnings."""
    counts, warnings = {}, []
    for later, earlier in CROSS_SPLITS:
        if later not in frames or earlier not in frames:
            continue
        theirs = frames[earlier].assign(key=row_key(frames[earlier]),
                                        label=frames[earlier]["label"].map(str))
        mine = frames[later].assign(key=row_key(frames[later]), label=frames[later]["label"].map(str))
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
    train_frame, train_where = raw["train"]
    task, why = infer_task(train_frame["label"][~is_missing_label(train_frame["label"])], cfg)
    for split, (frame, where) in raw.items():
        frame = normalize_labels(frame, task, cfg, where)
        cleaned[split], reports[split] = clean(frame, where, cfg)
        reports[split].read_as = frame.attrs.get("read_as", "")
        wheres[split] = where
    names = label_names(cleaned["train"]["label"], train_where, task, cfg.label_columns())
    if "validation" not in cleaned:
        stratify = task == "single_label"
        cleaned["train"], cleaned["validation"] = carve_validation(
            cleaned["train"], cfg.val_fraction, cfg.seed, train_where, stratify)
        how = "stratified by label" if stratify else "at random"
        reports["validation"] = SplitReport(
            read_as=f"carved from train: {cfg.val_fraction:g} of its distinct texts, {how}, "
                    f"seed {cfg.seed}", rows_read=0, kept=len(cleaned["validation"]))
        reports["train"].kept = len(cleaned["train"])
        wheres["validation"] = f"{train_where} (carved validation)"
    out = {}
    for split, frame in cleaned.items():
        columns = {"row_id": frame["row"].to_numpy(np.int64), "text": frame["text"].to_numpy(object)}
        if "text_pair" in frame:
            columns["text_pair"] = frame["text_pair"].to_numpy(object)
        columns["label"] = encode_labels(frame, names, wheres[split], task)
        out[split] = pd.DataFrame(columns)
        reports[split].labels = label_counts(frame, names, task, columns["label"])
    for split, rep in reports.items():
        n = rep.conflicts["texts"]
        if n and cfg.on_conflict == "keep":
            warnings.append(f"{wheres[split]}: {_plural(n, 'text')} {_occur(n)} with different "
                            f"labels (data rows {_groups(rep.conflicts['first_rows'], n)}); kept "
                            "as they are (prepare.on_conflict: keep); set it to drop or error")
    cross, shared = cross_split_duplicates(cleaned, wheres)
    warnings += shared
    if task == "single_label":
        warnings += single_row_classes(cleaned["train"], train_where)
    report = {"task": task, "task_reason": why, "pair": int("text_pair" in cleaned["train"]),
              "num_labels": len(names),
              "validation_carved": int("validation" not in raw),
              "splits": {s: vars(r) for s, r in reports.items()},
              "cross_split_duplicates": cross,
              "warnings": warnings}
    return out, names, report


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
    lines.append(f"prepare: task {report['task']}"
                 + (" on sentence pairs" if report.get("pair") else "")
                 + f" ({report['task_reason']})"
                 + ("; set prepare.task to choose another" if report["task_reason"] !=
                    "set by prepare.task" else ""))
    return lines
