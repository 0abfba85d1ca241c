"""Preparation: clean each split, build the label <-> id map, carve a stratified validation.

Nothing is dropped silently: every removed row is counted per reason in the report, and with
`on_invalid: error` (or `on_conflict: error`) the first bad row stops the stage with its file and
row named. Leakage is counted too: duplicate texts inside a split (found and dropped, separately),
the same text with different labels, and texts shared between splits. Texts are compared with
surrounding whitespace stripped (the tokenizer sees no difference).

Splits stream, so memory is bounded by a block of rows plus a few numbers per row, not by the
data. A first pass takes each split block by block (sources.iter_file): it drops empty texts
and missing labels (counting them), normalises labels for the task, writes the kept rows to a
scratch Parquet file and keeps three int64 per kept row: its data row, a 64-bit hash of its
stripped text and its label's code (regression: a hash of the label). Duplicates, conflicting
labels, texts shared between splits and the carve-out are computed on those arrays (24 bytes a
row: 240 MB at 10M rows), then a second pass over the scratch files yields the final splits
with the drops applied and labels encoded. Two different texts share a hash with probability
~n^2 / 2^65 (~3e-6 at 10M rows). Errors come in the order reading each split whole and then
cleaning it raised them, with the same row numbers and counts.
"""

from __future__ import annotations

import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from wellfed.config import PrepareConfig, number
from wellfed.data import markers

CROSS_SPLITS = (("validation", "train"), ("test", "train"), ("test", "validation"))
SHOWN = 5  # rows or classes a message names before "..."
OUT_ROWS = 65_536  # rows per frame of the second pass (~10 MB of 100-character texts)

Blocks = Callable[[], Iterable[pd.DataFrame]]
"""A split's rows as (row, text[, text_pair], label) frames; each call starts from the first
(the first pass may have to read train twice, see `prepare_blocks`)."""


@dataclass
class SplitReport:
    read_as: str = ""
    rows_read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {
        "empty_text": 0, "missing_label": 0, "duplicate": 0, "conflict": 0})
    missing_labels: dict[str, int] = field(default_factory=dict)
    """Rows dropped for a missing label, by the label as written (prepare.missing_labels)."""
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


def _hashes(values) -> np.ndarray:
    """64-bit hashes of strings (or tuples of them), consistent within one process."""
    return np.fromiter(map(hash, values), np.int64, count=len(values))


# ---------------------------------------------------------------- the task, from train's labels

def _hash_array() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass
class LabelEvidence:
    """What `infer_task` looks at in train's labels (missing ones out), gathered block by block
    so that the task is decided on the whole split; label texts are kept as 64-bit hashes."""

    lists: bool = False
    """Some label is a list."""
    several: int = 0
    """Rows whose label holds the delimiter."""
    several_example: str | None = None
    parts: np.ndarray = field(default_factory=_hash_array)
    """The distinct parts of the labels that hold the delimiter."""
    alone: np.ndarray = field(default_factory=_hash_array)
    """The distinct labels that do not."""
    numbers: bool = True
    """Every label is a number."""
    fraction_example: str | None = None
    """The first label that is a number and not whole."""
    distinct: np.ndarray = field(default_factory=_hash_array)

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
        self.parts = np.union1d(self.parts, _hashes(list(parts)))
        self.alone = np.union1d(self.alone, _hashes(alone))
        self.distinct = np.union1d(self.distinct, _hashes(labels))


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


# ---------------------------------------------------------------- first pass: block by block

@dataclass
class _Labels:
    """Every distinct normalised label of a classification run, all splits together, coded in
    order of first appearance."""

    codes: dict = field(default_factory=dict)
    values: list = field(default_factory=list)

    def code(self, value) -> int:
        if value not in self.codes:
            self.codes[value] = len(self.values)
            self.values.append(value)
        return self.codes[value]


@dataclass
class _Scan:
    """One split after the first pass. Per kept row (empty texts and missing labels out), in
    file order: `row` its data row, `key` a hash of its stripped text (and pair), `label` its
    code in `_Labels` (regression: a hash of the label) and, for regression, `targets` (NaN
    where a label is not a number). The rows themselves are in `scratch`."""

    where: str
    task: str | None
    scratch: Path
    read_as: str = ""
    warnings: list = field(default_factory=list)
    pair: bool = False
    rows_read: int = 0
    invalid: dict = field(default_factory=lambda: {"empty_text": [0, None, None],
                                                   "missing_label": [0, None, None]})
    """reason -> [rows, the first one's data row, its label]."""
    missing_labels: dict = field(default_factory=dict)
    """Rows with a missing label by the label as written (markers.tally)."""
    list_row: int | None = None
    """The first row holding a list of labels when the task takes one label per row."""
    row: np.ndarray = field(default_factory=_hash_array)
    key: np.ndarray = field(default_factory=_hash_array)
    label: np.ndarray = field(default_factory=_hash_array)
    targets: np.ndarray | None = None
    repeated: np.ndarray | None = None
    """Rows whose text occurs more than once (set when cleaning)."""


def _normalised(labels: list, missing: np.ndarray, task: str, cfg: PrepareConfig) -> list:
    """Multi-label: every label becomes a sorted tuple of distinct parts, so that duplicates and
    conflicts compare sets; the other tasks keep labels as they are."""
    if task != "multi_label":
        return list(labels)

    def parts(v):
        if isinstance(v, tuple):
            return tuple(sorted(set(v)))
        return tuple(sorted({p.strip() for p in v.split(cfg.label_delimiter) if p.strip()}))

    return [v if m else parts(v) for v, m in zip(labels, missing)]


def _targets(labels: list, width: int) -> np.ndarray:
    """Regression targets per label, float32 (labels, width); NaN where one is not a number."""
    out = np.full((len(labels), width), np.nan, np.float32)
    for i, label in enumerate(labels):
        values = [number(p) for p in (label if isinstance(label, tuple) else (label,))]
        if None not in values and len(values) == width:
            out[i] = values
    return out


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), object)  # element by element: tuples stay tuples
    for i, v in enumerate(values):
        out[i] = v
    return out


def _count_invalid(scan: _Scan, block: pd.DataFrame, empty: np.ndarray,
                   missing: np.ndarray) -> None:
    """Add a block's empty texts and missing labels to the scan: how many, and the first."""
    for reason, mask in (("empty_text", empty), ("missing_label", missing)):
        record = scan.invalid[reason]
        if mask.any():
            first = np.flatnonzero(mask)[0]
            record[0] += int(mask.sum())
            if record[1] is None:
                record[1], record[2] = int(block["row"].iat[first]), block["label"].iat[first]


def _scratch_rows(block: pd.DataFrame, keep: np.ndarray, labels: np.ndarray,
                  lists: bool) -> pa.Table:
    """A block's kept rows as the scratch file holds them: row, text[, text_pair], label (a
    string, or a list of strings for multi-label and several targets)."""
    columns = {"row": pa.array(block["row"].to_numpy(np.int64)[keep])}
    for name in ("text", "text_pair"):
        if name in block:
            columns[name] = pa.array(block[name].to_numpy(object)[keep], pa.string())
    columns["label"] = (pa.array(labels.tolist(), pa.list_(pa.string())) if lists else
                        pa.array([v if isinstance(v, str) else str(v) for v in labels],
                                 pa.string()))
    return pa.table(columns)


def _scan(blocks: Blocks, where: str, task: str | None, cfg: PrepareConfig, labels: _Labels,
          scratch: Path, evidence: LabelEvidence | None = None) -> _Scan:
    """The first pass over one split (see the module docstring). Task None (train, task: auto):
    the task the first block's labels show, gathering `evidence` for the whole split."""
    scan = _Scan(where=where, task=task, scratch=scratch)
    regression = (task == "regression" if task else False)
    kept = {"row": [], "key": [], "label": [], "targets": []}
    writer = None
    bar = tqdm(desc=f"prepare {Path(where).name}", unit="rows", mininterval=1.0, leave=False,
               disable=None)
    try:
        for i, block in enumerate(blocks()):
            if i == 0:
                scan.read_as = block.attrs.get("read_as", "")
                scan.warnings = list(block.attrs.get("warnings", []))
                scan.pair = "text_pair" in block
            scan.rows_read += len(block)
            bar.update(len(block))
            codes, uniques = pd.factorize(block["label"].to_numpy(object))  # -1: None, NaN
            uniques = list(uniques)
            missing_u = markers.missing(uniques, markers.spellings(cfg.missing_labels),
                                        parts=len(cfg.label_columns()) > 1)
            missing = np.append(missing_u, True)[codes]
            if evidence is not None:
                counts = np.bincount(codes[codes >= 0], minlength=len(uniques))
                evidence.add([u for u, m in zip(uniques, missing_u) if not m],
                             counts[~missing_u], cfg.label_delimiter)
            if scan.task is None:
                scan.task = infer_task(evidence, cfg)[0]
                regression = scan.task == "regression"
            normal = _normalised(uniques, missing_u, scan.task, cfg)
            if scan.task != "multi_label" and len(cfg.label_columns()) == 1:
                listed = np.array([isinstance(v, tuple) for v in uniques] + [False])[codes]
                if listed.any() and scan.list_row is None:
                    scan.list_row = int(block["row"].to_numpy()[listed][0])

            empty = np.zeros(len(block), bool)
            stripped = {}
            for column in ("text", "text_pair"):
                if column in block:
                    stripped[column] = block[column].str.strip()
                    empty |= (block[column].isna() | (stripped[column] == "")).to_numpy(bool)
            missing &= ~empty
            _count_invalid(scan, block, empty, missing)
            markers.tally(scan.missing_labels, uniques, codes, missing)
            keep = ~(empty | missing)
            if not keep.any():
                continue
            key = stripped["text"][keep]
            if "text_pair" in stripped:
                key = key + "\x1f" + stripped["text_pair"][keep]
            kept["key"].append(_hashes(key))
            rows = block["row"].to_numpy(np.int64)[keep]
            kept["row"].append(rows)
            at = codes[keep]
            if regression:
                texts = [v if isinstance(v, str) else str(v) for v in normal]
                kept["label"].append(_hashes(texts)[at])
                kept["targets"].append(_targets(normal, len(cfg.label_columns()))[at])
            else:
                coded = np.array([-1 if m else labels.code(v) for v, m in zip(normal, missing_u)],
                                 np.int64)
                kept["label"].append(coded[at])
            lists = scan.task == "multi_label" or len(cfg.label_columns()) > 1
            table = _scratch_rows(block, keep, _objects(normal)[at], lists)
            writer = writer or pq.ParquetWriter(scratch, table.schema)
            writer.write_table(table)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    for name in list(kept):  # one array at a time: the parts and the whole of one coexist
        parts = kept.pop(name)
        if parts:
            setattr(scan, name, np.concatenate(parts))
        del parts
    if regression and scan.targets is None:
        scan.targets = np.zeros((0, len(cfg.label_columns())), np.float32)
    return scan


def _labels_at(scan: _Scan, positions: list[int]) -> list:
    """The labels of a few kept rows (for a message), read back from the scratch file."""
    wanted, found, start = sorted(set(positions)), {}, 0
    for batch in pq.ParquetFile(scan.scratch, pre_buffer=False).iter_batches(columns=["label"]):
        end = start + batch.num_rows
        for p in wanted:
            if start <= p < end:
                value = batch.column(0)[p - start].as_py()
                found[p] = tuple(value) if isinstance(value, list) else value
        start = end
    return [found[p] for p in positions]


# ---------------------------------------------------------------- across rows: on the arrays

def _repeated(key: np.ndarray) -> np.ndarray:
    """Rows whose text occurs more than once in the split: the only ones that can conflict,
    repeat or stand behind another copy in the carve-out. The one hash table over every row
    (~250 MB at 10M rows); the other checks hash just these."""
    return pd.Series(key).duplicated(keep=False).to_numpy()


def _conflicts(key: np.ndarray, label: np.ndarray,
               repeated: np.ndarray) -> tuple[np.ndarray, int, list[list[int]]]:
    """Rows whose text also occurs with another label, how many such texts there are, and the
    positions of the first rows (up to 4) of the first few such texts, in order of first
    occurrence."""
    mask = np.zeros(len(key), bool)
    rows = np.flatnonzero(repeated)
    if not len(rows):
        return mask, 0, []
    pairs = pd.DataFrame({"key": key[rows], "label": label[rows]})
    per_text = pairs.groupby("key", sort=False)["label"].nunique()
    several = per_text.index[per_text > 1]
    mask[rows[pairs["key"].isin(several).to_numpy()]] = True
    at = np.flatnonzero(mask)
    examples = [at[key[at] == k][:4].tolist() for k in pd.unique(key[at])[:SHOWN]]
    return mask, len(several), examples


def _duplicates(key: np.ndarray, label: np.ndarray, keep: np.ndarray,
                repeated: np.ndarray) -> np.ndarray:
    """Kept rows repeating an earlier kept row's text and label (the first one not counted)."""
    dup = np.zeros(len(key), bool)
    rows = np.flatnonzero(keep & repeated)
    if len(rows):
        again = pd.DataFrame({"key": key[rows], "label": label[rows]}).duplicated()
        dup[rows[again.to_numpy()]] = True
    return dup


def _clean(scan: _Scan, cfg: PrepareConfig) -> tuple[SplitReport, np.ndarray]:
    """Reject or count what the first pass dropped (empty texts, missing labels); drop (or
    reject) conflicting labels; count and optionally drop duplicates. Returns the report and
    the mask of the rows kept, over the scan's rows."""
    where = scan.where
    if scan.list_row is not None:
        raise ValueError(f"{where}: data row {scan.list_row + 1} has a list of labels, but the "
                         f"task is {scan.task}; set prepare.task: multi_label (or fix the label "
                         "column)")
    report = SplitReport(rows_read=scan.rows_read)
    if not scan.rows_read:
        raise ValueError(f"{where}: has a header but no data rows; add rows or fix the path")
    for reason, fix in (("empty_text", "fill in the text"), ("missing_label", "add the label")):
        count, row, label = scan.invalid[reason]
        if count and cfg.on_invalid == "error":
            written = (f"written {label!r}; " if reason == "missing_label"
                       and isinstance(label, (str, int)) else "")
            raise ValueError(f"{where}: data row {row + 1} has {reason.replace('_', ' ')} "
                             f"({written}{_plural(count, 'such row')}); {fix}, or set "
                             f"prepare.on_invalid: skip to drop and count them")
        report.dropped[reason] = count
    report.missing_labels = dict(scan.missing_labels)

    keep = np.ones(len(scan.row), bool)
    scan.repeated = _repeated(scan.key)
    conflict, texts, examples = _conflicts(scan.key, scan.label, scan.repeated)
    report.conflicts = {"texts": texts, "rows": int(conflict.sum()),
                        "first_rows": [[int(scan.row[p]) + 1 for p in group] for group in examples]}
    if texts and cfg.on_conflict == "error":
        labels = iter(_labels_at(scan, [p for group in examples for p in group]))
        shown = _groups([[f"{int(scan.row[p]) + 1} {next(labels)!r}" for p in group]
                         for group in examples], texts)
        raise ValueError(f"{where}: {_plural(texts, 'text')} {_occur(texts)} with different "
                         f"labels in {_plural(int(conflict.sum()), 'row')} (data rows {shown}); "
                         "fix those labels, or set prepare.on_conflict: drop to remove such "
                         "rows, or keep to train on them as they are")
    if cfg.on_conflict == "drop":
        report.dropped["conflict"] = int(conflict.sum())
        keep &= ~conflict
    dup = _duplicates(scan.key, scan.label, keep, scan.repeated)
    report.duplicates_found = int(dup.sum())
    if cfg.drop_duplicates:
        report.dropped["duplicate"] = int(dup.sum())
        keep &= ~dup
    report.kept = int(keep.sum())
    if report.kept == 0:
        raise ValueError(f"{where}: no usable rows left after cleaning; check text/label columns")
    return report, keep


def _present(scan: _Scan, mask: np.ndarray, labels: _Labels) -> list:
    """The distinct labels of the rows in `mask` (classification)."""
    return [labels.values[c] for c in np.flatnonzero(np.bincount(scan.label[mask]))]


def _carve(scan: _Scan, keep: np.ndarray, fraction: float, seed: int, where: str,
           stratify: bool, labels: _Labels) -> np.ndarray:
    """Seeded split of train into (train, validation) by distinct text, stratified by label
    (single-label) or at random (multi-label, regression): every copy of a text lands on the
    same side, so validation never repeats a train text. Returns the validation rows' mask."""
    from sklearn.model_selection import train_test_split  # ~1-3 s to import: only when carving

    first = keep.copy()  # a text's first kept row stands for it
    again = np.flatnonzero(keep & scan.repeated)
    first[again[pd.Series(scan.key[again]).duplicated().to_numpy()]] = False
    texts = np.flatnonzero(first)
    del first, again
    if not stratify:
        _, held = train_test_split(np.arange(len(texts)), random_state=seed,
                                   test_size=max(1, int(round(len(texts) * fraction))))
        return keep & _isin(scan.key, scan.key[texts[held]])
    codes = scan.label[texts]
    per_class = np.bincount(codes, minlength=len(labels.values))
    classes = int((per_class > 0).sum())
    if ((per_class > 0) & (per_class < 2)).any():
        counts = pd.Series(_objects([labels.values[c] for c in codes])).value_counts()
        few = counts[counts < 2]

        def one(label):
            rows = scan.row[keep & (scan.label == labels.codes[label])] + 1
            if len(rows) == 1:
                return f"{label!r} (1 row: data row {_rows(rows)})"
            return f"{label!r} ({len(rows)} rows, all the same text: data rows {_rows(rows)})"

        listed = ", ".join(one(label) for label in few.index[:SHOWN])
        raise ValueError(f"{where}: cannot carve a stratified validation split: "
                         f"{'class' if len(few) == 1 else 'classes'} {listed} "
                         f"{'needs' if len(few) == 1 else 'need'} at least 2 distinct texts "
                         "(one for each side); add examples, remove those rows, or provide "
                         "prepare.validation")
    n_val = int(round(len(texts) * fraction))
    if n_val < classes:
        need = math.ceil(classes / len(texts) * 100) / 100
        while round(len(texts) * need) < classes:
            need = round(need + 0.01, 2)
        fix = (f"raise prepare.val_fraction to {need:g} or provide prepare.validation"
               if need < 0.5 else "provide prepare.validation or add rows")
        raise ValueError(f"{where}: cannot carve a stratified validation split: val_fraction "
                         f"{fraction:g} of {_plural(len(texts), 'distinct text')} is "
                         f"{_plural(n_val, 'validation row')}, fewer than the {classes} "
                         f"classes (each needs one); {fix}")
    # Codes ranked as their labels sort: the split then sees the classes in the order it would
    # see the label strings in, and draws the same rows.
    order = sorted(range(len(labels.values)), key=labels.values.__getitem__)
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    classes = rank[codes]
    del codes
    held = stratified_held(classes, n_val, seed)
    return keep & _isin(scan.key, scan.key[texts[held]])


def stratified_held(classes: np.ndarray, n_held: int, seed: int) -> np.ndarray:
    """The positions `train_test_split(range(len(classes)), test_size=n_held,
    random_state=seed, stratify=classes)` holds out, drawn with the same random calls on numpy
    arrays: sklearn's StratifiedShuffleSplit gathers the train side in a Python list of numpy
    scalars, ~40 bytes a row (~360 MB for 9M texts). tests/data/test_prepare.py compares the
    two."""
    from sklearn.utils.extmath import _approximate_mode

    counts = np.bincount(classes)  # classes are small ints: np.unique without its sort
    of_row = (np.cumsum(counts > 0) - 1)[classes]
    counts = counts[counts > 0]
    by_class = np.split(np.argsort(of_row, kind="stable"), np.cumsum(counts)[:-1])
    del of_row
    rng = np.random.RandomState(seed)
    n_train = len(classes) - n_held
    train_i = _approximate_mode(counts, n_train, rng)
    held_i = _approximate_mode(counts - train_i, n_held, rng)
    held = []
    for i, rows in enumerate(by_class):
        order = rng.permutation(counts[i])
        held.append(rows.take(order[train_i[i]:train_i[i] + held_i[i]], mode="clip"))
    # sklearn shuffles the train side next: the same draws, without building it (a shuffle's
    # draws depend only on the length).
    rng.permutation(int(train_i.sum()))
    return rng.permutation(np.concatenate(held))


def _isin(values: np.ndarray, among: np.ndarray) -> np.ndarray:
    """np.isin with a hash table of the smaller side (pandas) instead of sorting both: less
    memory when one side has 10M rows."""
    if len(among) > len(values):
        among = among[pd.Series(among).isin(values).to_numpy()]
    return pd.Series(values).isin(among).to_numpy()


def _check_labels(scan: _Scan, mask: np.ndarray, names: list[str], labels: _Labels,
                  task: str, where: str, listed: list) -> None:
    """What encoding a split's labels can fail on: a label train never has (classification),
    a label that is not a number (regression). `listed`: prepare.missing_labels, for the fix
    when the label is a marker."""
    if task == "regression":
        bad = np.isnan(scan.targets[mask]).any(axis=1)
        if bad.any():
            first = np.flatnonzero(mask)[bad][0]
            label = _labels_at(scan, [int(first)])[0]
            shown = label if isinstance(label, tuple) else (label,)
            raise ValueError(f"{where}: data row {int(scan.row[first]) + 1} has the label "
                             f"{shown[0] if len(shown) == 1 else shown!r}, not a number "
                             f"({int(bad.sum())} such row{'s' if bad.sum() > 1 else ''}); a "
                             "regression needs numeric labels: fix them, or set prepare.task"
                             + markers.hint(next((p for p in shown if number(p) is None), shown[0]),
                                          listed))
        return
    multi = task == "multi_label"
    present = _present(scan, mask, labels)
    seen = {p for v in present for p in v} if multi else set(present)
    unknown = sorted(seen - set(names))
    if unknown:
        holds = [labels.codes[v] for v in present if (unknown[0] in v if multi
                                                      else v == unknown[0])]
        row = int(scan.row[np.flatnonzero(mask & _isin(scan.label, np.array(holds)))[0]])
        shown = ", ".join(map(repr, names[:10])) + (f", ... ({len(names)} in all)"
                                                      if len(names) > 10 else "")
        others = f" and {_plural(len(unknown) - 1, 'other label')}" if len(unknown) > 1 else ""
        raise ValueError(f"{where}: label {unknown[0]!r} (data row {row + 1}){others} never "
                         f"occurs in train (train labels: {shown}); fix the label or add train "
                         "examples" + markers.hint(unknown[0], listed))


def _label_counts(scan: _Scan, mask: np.ndarray, names: list[str], labels: _Labels,
                  task: str) -> dict:
    """Rows per class (multi-label: rows holding each label); regression: each target's
    mean, sd, min and max."""
    if task == "regression":
        values = scan.targets[mask] if mask.any() else np.zeros((0, len(names)))
        return {name: {"mean": round(float(v.mean()), 4), "sd": round(float(v.std()), 4),
                       "min": float(v.min()), "max": float(v.max())}
                for name, v in zip(names, values.T)}
    rows = np.bincount(scan.label[mask], minlength=len(labels.values))
    counts: dict = {}
    for code in np.flatnonzero(rows):
        value = labels.values[code]
        for name in (value if task == "multi_label" else (value,)):
            counts[name] = counts.get(name, 0) + int(rows[code])
    return {name: counts.get(name, 0) for name in names}


def _pairs(scan: _Scan, at: np.ndarray) -> np.ndarray:
    """One hash per (text, label) of rows `at`."""
    return pd.util.hash_pandas_object(pd.DataFrame({"key": scan.key[at], "label": scan.label[at]}),
                                      index=False).to_numpy()


def _cross_split(outputs: dict, wheres: dict[str, str]) -> tuple[dict[str, int], list[str]]:
    """Rows of a later split whose text is also in an earlier one, per pair, with warnings."""
    counts, warnings = {}, []
    for later, earlier in CROSS_SPLITS:
        if later not in outputs or earlier not in outputs:
            continue
        (mine, mine_mask), (theirs, theirs_mask) = outputs[later], outputs[earlier]
        rows, their_rows = np.flatnonzero(mine_mask), np.flatnonzero(theirs_mask)
        shared = rows[_isin(mine.key[rows], theirs.key[their_rows])]
        counts[f"{later}_in_{earlier}"] = len(shared)
        if len(shared):
            differ = int((~_isin(_pairs(mine, shared), _pairs(theirs, their_rows))).sum())
            warnings.append(
                f"{wheres[later]}: {_plural(len(shared), later + ' row')} "
                f"{'has a text' if len(shared) == 1 else 'have texts'} that {earlier} also holds "
                f"(data row{'s' if len(shared) > 1 else ''} "
                f"{_rows(mine.row[shared[:SHOWN]] + 1, len(shared))}; "
                f"{differ or 'none'} with a different label); {later} scores will be "
                "optimistic: remove them from one of the two files")
    return counts, warnings


# ---------------------------------------------------------------- second pass: the outputs

def _output(scan: _Scan, mask: np.ndarray, names: list[str], labels: _Labels,
            task: str) -> Iterator[pd.DataFrame]:
    """One split's final rows, OUT_ROWS at a time: (row_id, text[, text_pair], label) read back
    from the scratch file with `mask` applied; label is a class id (int64), a multi-hot
    float32 vector (multi-label) or the targets (regression)."""
    ids = {name: i for i, name in enumerate(names)}
    if task == "single_label":
        of_code = np.array([ids.get(v, -1) for v in labels.values], np.int64)
        encode = lambda at: of_code[scan.label[at]]  # noqa: E731
    elif task == "multi_label":
        hot = np.zeros((len(labels.values), len(names)), np.float32)
        for code, value in enumerate(labels.values):
            hot[code, [ids[p] for p in value if p in ids]] = 1.0
        encode = lambda at: list(hot[scan.label[at]])  # noqa: E731
    else:
        encode = lambda at: list(scan.targets[at])  # noqa: E731
    columns = ["row", "text"] + (["text_pair"] if scan.pair else [])
    # pre_buffer=False: pre-buffered reads stay cached for the reader's life, so memory grew
    # with the file (+310 MB over a 3M-row scratch file; flat without).
    source = pq.ParquetFile(scan.scratch, pre_buffer=False) if scan.scratch.exists() else None
    start, batches = 0, source.iter_batches(OUT_ROWS, columns=columns) if source else []
    yielded = False
    for batch in batches:
        at = start + np.flatnonzero(mask[start:start + batch.num_rows])
        local, start = at - start, start + batch.num_rows
        if len(at):
            yield _frame(batch.take(pa.array(local)), encode(at), scan.pair)
            yielded = True
    if not yielded:  # no rows at all: still the columns
        yield _frame(pa.table({"row": pa.array([], pa.int64()), "text": pa.array([], pa.string()),
                               "text_pair": pa.array([], pa.string())}),
                     encode(np.zeros(0, np.int64)), scan.pair)


def _frame(batch, label, pair: bool) -> pd.DataFrame:
    frame = {"row_id": batch.column("row").to_numpy(),
             "text": batch.column("text").to_numpy(zero_copy_only=False)}
    if pair:
        frame["text_pair"] = batch.column("text_pair").to_numpy(zero_copy_only=False)
    frame["label"] = label
    return pd.DataFrame(frame)


# ---------------------------------------------------------------- the whole preparation

def prepare_blocks(raw: dict[str, tuple[Blocks, str]], cfg: PrepareConfig, scratch: Path):
    """raw: split -> (blocks, where), train first, then validation and test when given;
    scratch: an empty folder for the first pass's files (about the raw data's size, as Parquet).

    Returns (splits: split -> frames of (row_id, text[, text_pair], label id) to be read while
    `scratch` still exists, names, report dict)."""
    scratch = Path(scratch)
    train_blocks, train_where = raw["train"]
    labels = _Labels()
    if cfg.task == "auto" and len(cfg.label_columns()) == 1:
        evidence = LabelEvidence()
        train = _scan(train_blocks, train_where, None, cfg, labels, scratch / "train.parquet",
                      evidence)
        task, why = infer_task(evidence, cfg)
        if task != train.task:  # the first block's labels looked like another task: read again
            labels = _Labels()
            train = _scan(train_blocks, train_where, task, cfg, labels, scratch / "train.parquet")
    else:
        task, why = infer_task(LabelEvidence(), cfg)
        train = _scan(train_blocks, train_where, task, cfg, labels, scratch / "train.parquet")
    scans = {"train": train}
    for split, (blocks, where) in raw.items():
        if split != "train":
            scans[split] = _scan(blocks, where, task, cfg, labels, scratch / f"{split}.parquet")

    reports, keep, wheres = {}, {}, {}
    for split, scan in scans.items():  # errors in the order cleaning each split raised them
        reports[split], keep[split] = _clean(scan, cfg)
        reports[split].read_as = scan.read_as
        wheres[split] = scan.where
    names = label_names(pd.Series(_objects(_present(train, keep["train"], labels)), dtype=object)
                        if task != "regression" else pd.Series([], dtype=object),
                        train_where, task, cfg.label_columns())
    outputs = {split: (scan, keep[split]) for split, scan in scans.items()}
    if "validation" not in scans:
        stratify = task == "single_label"
        in_val = _carve(train, keep["train"], cfg.val_fraction, cfg.seed, train_where, stratify,
                        labels)
        outputs["train"] = (train, keep["train"] & ~in_val)
        outputs["validation"] = (train, in_val)
        how = "stratified by label" if stratify else "at random"
        reports["validation"] = SplitReport(
            read_as=f"carved from train: {cfg.val_fraction:g} of its distinct texts, {how}, "
                    f"seed {cfg.seed}", rows_read=0, kept=int(in_val.sum()))
        reports["train"].kept = int(outputs["train"][1].sum())
        wheres["validation"] = f"{train_where} (carved validation)"
    for split, (scan, mask) in outputs.items():
        _check_labels(scan, mask, names, labels, task, wheres[split], cfg.missing_labels)
        reports[split].labels = _label_counts(scan, mask, names, labels, task)

    warnings = [w for scan in scans.values() for w in scan.warnings]
    for split, rep in reports.items():
        n = rep.conflicts["texts"]
        if n and cfg.on_conflict == "keep":
            warnings.append(f"{wheres[split]}: {_plural(n, 'text')} {_occur(n)} with different "
                            f"labels (data rows {_groups(rep.conflicts['first_rows'], n)}); kept "
                            "as they are (prepare.on_conflict: keep); set it to drop or error")
    cross, shared = _cross_split(outputs, wheres)
    warnings += shared
    if task != "regression":  # a negative number is a value there, not a marker
        warnings += markers.warning({s: r.labels for s, r in reports.items()},
                                    reports["train"].kept, train_where, cfg.missing_labels)
    if task == "single_label":
        final = outputs["train"][1]
        if (np.bincount(train.label[final]) == 1).any():  # the message orders them as pandas does
            warnings += single_row_classes(pd.DataFrame({
                "label": pd.Series(_objects([labels.values[c] for c in train.label[final]]),
                                   dtype=object),
                "row": train.row[final]}), train_where)
    report = {"task": task, "task_reason": why, "pair": int(train.pair),
              "num_labels": len(names),
              "validation_carved": int("validation" not in raw),
              "splits": {s: vars(r) for s, r in reports.items()},
              "cross_split_duplicates": cross,
              "warnings": warnings}
    splits = {split: _output(scan, mask, names, labels, task)
              for split, (scan, mask) in outputs.items()}
    return splits, names, report


def prepare_splits(raw: dict[str, tuple[pd.DataFrame, str]], cfg: PrepareConfig):
    """`prepare_blocks` for frames in memory (split -> (frame from sources, where)).

    Returns (splits: split -> frame with row/text/label-id columns, names, report dict)."""
    with tempfile.TemporaryDirectory(prefix="wellfed-prepare-") as scratch:
        blocks = {split: (lambda frame=frame: [frame], where) for split, (frame, where) in raw.items()}
        outputs, names, report = prepare_blocks(blocks, cfg, Path(scratch))
        splits = {}
        for split, frames in outputs.items():
            frames = list(frames)
            splits[split] = (frames[0] if len(frames) == 1
                             else pd.concat(frames, ignore_index=True))
    return splits, names, report


# ---------------------------------------------------------------- labels and messages

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
