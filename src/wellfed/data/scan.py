"""The first pass over a split, block by block: empty texts and missing labels are counted and
left out, labels normalised for the task, the kept rows written to a scratch Parquet file, and
three int64 kept per row (its data row, a hash of its stripped text, its label's code) for the
checks across rows, which run on those arrays (see prepare.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from wellfed import texts as rule
from wellfed.config import PrepareConfig, number
from wellfed.data import markers
from wellfed.data.hashing import empty_int64, hashes
from wellfed.data.task_inference import LabelEvidence, infer_task
from wellfed.data.wording import plural

Blocks = Callable[[], Iterable[pd.DataFrame]]
"""A split's rows as (row, text[, text_pair], label) frames; each call starts from the first
(the first pass may have to read train twice, see `prepare.prepare_blocks`)."""


@dataclass
class LabelCodes:
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
class Scan:
    """One split after the first pass. Per kept row (empty texts and missing labels out), in
    file order: `row` its data row, `key` a hash of its stripped text (and pair), `label` its
    code in `LabelCodes` (regression: a hash of the label) and, for regression, `targets` (NaN
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
    nul_texts: list = field(default_factory=lambda: [0, None])
    """[kept rows whose text (or second text) holds a NUL byte, the first one's data row]."""
    missing_labels: dict = field(default_factory=dict)
    """Rows with a missing label by the label as written (markers.tally)."""
    list_row: int | None = None
    """The first row holding a list of labels when the task takes one label per row."""
    row: np.ndarray = field(default_factory=empty_int64)
    key: np.ndarray = field(default_factory=empty_int64)
    label: np.ndarray = field(default_factory=empty_int64)
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


def objects(values: list) -> np.ndarray:
    out = np.empty(len(values), object)  # element by element: tuples stay tuples
    for i, v in enumerate(values):
        out[i] = v
    return out


def _count_invalid(scan: Scan, block: pd.DataFrame, empty: np.ndarray,
                   missing: np.ndarray) -> None:
    """Add a block's empty texts and missing labels to the scan: how many, and the first."""
    for reason, mask in (("empty_text", empty), ("missing_label", missing)):
        record = scan.invalid[reason]
        if mask.any():
            first = np.flatnonzero(mask)[0]
            record[0] += int(mask.sum())
            if record[1] is None:
                record[1], record[2] = int(block["row"].iat[first]), block["label"].iat[first]


def _count_nul(scan: Scan, table: pa.Table) -> None:
    """Count the kept rows whose text holds a NUL byte. Kept as written, as every text is (no
    rule rewrites a text), but never silently: such a byte is most often damage (a binary
    field, a bad export), and tokenizers differ on it. ~0.2 s per million 100-character rows."""
    found = None
    for name in ("text", "text_pair"):
        if name in table.column_names:
            has = pc.fill_null(pc.match_substring(table[name], "\x00"), False)
            found = has if found is None else pc.or_(found, has)
    if found is not None and pc.any(found).as_py():
        mask = found.to_numpy(zero_copy_only=False)
        scan.nul_texts[0] += int(mask.sum())
        if scan.nul_texts[1] is None:
            scan.nul_texts[1] = int(table["row"].to_numpy()[mask][0])


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


def scan_split(blocks: Blocks, where: str, task: str | None, cfg: PrepareConfig,
               labels: LabelCodes, scratch: Path, evidence: LabelEvidence | None = None) -> Scan:
    """The first pass over one split (see the module docstring). Task None (train, task: auto):
    the task the first block's labels show, gathering `evidence` for the whole split."""
    scan = Scan(where=where, task=task, scratch=scratch)
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
                    empty |= rule.empty(block[column], stripped[column])  # wellfed.texts
            missing &= ~empty
            _count_invalid(scan, block, empty, missing)
            markers.tally(scan.missing_labels, uniques, codes, missing)
            keep = ~(empty | missing)
            if not keep.any():
                continue
            key = stripped["text"][keep]
            if "text_pair" in stripped:
                key = key + "\x1f" + stripped["text_pair"][keep]
            kept["key"].append(hashes(key))
            rows = block["row"].to_numpy(np.int64)[keep]
            kept["row"].append(rows)
            at = codes[keep]
            if regression:
                texts = [v if isinstance(v, str) else str(v) for v in normal]
                kept["label"].append(hashes(texts)[at])
                kept["targets"].append(_targets(normal, len(cfg.label_columns()))[at])
            else:
                coded = np.array([-1 if m else labels.code(v) for v, m in zip(normal, missing_u)],
                                 np.int64)
                kept["label"].append(coded[at])
            lists = scan.task == "multi_label" or len(cfg.label_columns()) > 1
            table = _scratch_rows(block, keep, objects(normal)[at], lists)
            _count_nul(scan, table)
            writer = writer or pq.ParquetWriter(scratch, table.schema)
            writer.write_table(table)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    if scan.nul_texts[0]:
        count, row = scan.nul_texts
        scan.warnings.append(
            f"{where}: {plural(count, 'text')} {'holds' if count == 1 else 'hold'} a NUL byte (the "
            f"first: data row {row + 1}); kept as written (a BERT tokenizer drops the character, "
            "a byte-level one reads it as a token); if it is damage, remove it from the file "
            f"(e.g. tr -d '\\000' < {Path(where).name} > fixed{Path(where).suffix})")
    for name in list(kept):  # one array at a time: the parts and the whole of one coexist
        parts = kept.pop(name)
        if parts:
            setattr(scan, name, np.concatenate(parts))
        del parts
    if regression and scan.targets is None:
        scan.targets = np.zeros((0, len(cfg.label_columns())), np.float32)
    return scan


def labels_at(scan: Scan, positions: list[int]) -> list:
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
