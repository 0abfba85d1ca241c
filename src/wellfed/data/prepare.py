"""Preparation: clean each split, build the label <-> id map, carve a stratified validation.

Nothing is dropped silently: every removed row is counted per reason in the report, and with
`on_invalid: error` (or `on_conflict: error`) the first bad row stops the stage with its file and
row named. Leakage is counted too: duplicate texts inside a split (found and dropped, separately),
the same text with different labels, and texts shared between splits. Texts are compared with
surrounding whitespace stripped (the tokenizer sees no difference).

Splits stream, so memory is bounded by a block of rows plus a few numbers per row, not by the
data. A first pass (scan.py) takes each split block by block (sources.iter_file): it drops
empty texts and missing labels (counting them), normalises labels for the task, writes the kept
rows to a scratch Parquet file and keeps three int64 per kept row: its data row, a 64-bit hash
of its stripped text and its label's code (regression: a hash of the label). Duplicates,
conflicting labels (cleaning.py), texts shared between splits (leakage.py) and the carve-out
(carve.py) are computed on those arrays (24 bytes a row: 240 MB at 10M rows), then a second
pass over the scratch files (encoding.py) yields the final splits with the drops applied and
labels encoded. Errors come in the order reading each split whole and then cleaning it raised
them, with the same row numbers and counts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from wellfed.config import PrepareConfig
from wellfed.data import coverage, markers
from wellfed.data.carve import carve
from wellfed.data.cleaning import clean
from wellfed.data.encoding import encoded_frames
from wellfed.data.label_map import (check_labels, label_counts, label_names, present_labels,
                                    single_row_classes)
from wellfed.data.leakage import cross_split
from wellfed.data.report import SplitReport
from wellfed.data.scan import Blocks, LabelCodes, objects, scan_split
from wellfed.data.task_inference import LabelEvidence, infer_task
from wellfed.data.wording import group_list, occur, plural


def prepare_blocks(raw: dict[str, tuple[Blocks, str]], cfg: PrepareConfig, scratch: Path):
    """raw: split -> (blocks, where), train first, then validation and test when given;
    scratch: an empty folder for the first pass's files (about the raw data's size, as Parquet).

    Returns (splits: split -> frames of (row_id, text[, text_pair], label id) to be read while
    `scratch` still exists, names, report dict)."""
    scratch = Path(scratch)
    train_blocks, train_where = raw["train"]
    first_pass = scratch / "train.parquet"
    labels = LabelCodes()
    if cfg.task == "auto" and len(cfg.label_columns()) == 1:
        evidence = LabelEvidence()
        train = scan_split(train_blocks, train_where, None, cfg, labels, first_pass, evidence)
        task, why = infer_task(evidence, cfg)
        if task != train.task:  # the first block's labels looked like another task: read again
            labels = LabelCodes()
            train = scan_split(train_blocks, train_where, task, cfg, labels, first_pass)
    else:
        task, why = infer_task(LabelEvidence(), cfg)
        train = scan_split(train_blocks, train_where, task, cfg, labels, first_pass)
    scans = {"train": train}
    for split, (blocks, where) in raw.items():
        if split != "train":
            scans[split] = scan_split(blocks, where, task, cfg, labels,
                                      scratch / f"{split}.parquet")

    reports, keep, wheres = {}, {}, {}
    for split, scan in scans.items():  # errors in the order cleaning each split raised them
        reports[split], keep[split] = clean(scan, cfg)
        reports[split].read_as = scan.read_as
        wheres[split] = scan.where
    names = label_names(pd.Series(objects(present_labels(train, keep["train"], labels)),
                                  dtype=object)
                        if task != "regression" else pd.Series([], dtype=object),
                        train_where, task, cfg.label_columns())
    outputs = {split: (scan, keep[split]) for split, scan in scans.items()}
    if "validation" not in scans:
        stratify = task == "single_label"
        in_val = carve(train, keep["train"], cfg.val_fraction, cfg.seed, train_where, stratify,
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
        check_labels(scan, mask, names, labels, task, wheres[split], cfg.missing_labels)
        reports[split].labels = label_counts(scan, mask, names, labels, task)

    warnings = [w for scan in scans.values() for w in scan.warnings]
    for split, rep in reports.items():
        n = rep.conflicts["texts"]
        if n and cfg.on_conflict == "keep":
            warnings.append(f"{wheres[split]}: {plural(n, 'text')} {occur(n)} with different "
                            f"labels (data rows {group_list(rep.conflicts['first_rows'], n)}); "
                            "kept as they are (prepare.on_conflict: keep); set it to drop or "
                            "error")
    for split in ("validation", "test"):  # can it judge a model: classes and rows enough
        if split in reports and (found := coverage.gap(split, task, reports[split].labels)):
            warnings.append(found.warning(wheres[split]))
    cross, shared = cross_split(outputs, wheres)
    warnings += shared
    if task != "regression":  # a negative number is a value there, not a marker
        warnings += markers.warning({s: r.labels for s, r in reports.items()},
                                    reports["train"].kept, train_where, cfg.missing_labels)
    if task == "single_label":
        final = outputs["train"][1]
        if (np.bincount(train.label[final]) == 1).any():  # the message orders them as pandas does
            warnings += single_row_classes(pd.DataFrame({
                "label": pd.Series(objects([labels.values[c] for c in train.label[final]]),
                                   dtype=object),
                "row": train.row[final]}), train_where)
    report = {"task": task, "task_reason": why, "pair": int(train.pair),
              "num_labels": len(names),
              "validation_carved": int("validation" not in raw),
              "splits": {s: vars(r) for s, r in reports.items()},
              "cross_split_duplicates": cross,
              "warnings": warnings}
    splits = {split: encoded_frames(scan, mask, names, labels, task)
              for split, (scan, mask) in outputs.items()}
    return splits, names, report
