"""The validation split carved from train when prepare.validation is "": seeded, by distinct
text (every copy of a text on one side), stratified by label for a single-label task."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from wellfed.data.hashing import isin
from wellfed.data.scan import LabelCodes, Scan, objects
from wellfed.data.wording import SHOWN, plural, row_list


def carve(scan: Scan, keep: np.ndarray, fraction: float, seed: int, where: str,
          stratify: bool, labels: LabelCodes) -> np.ndarray:
    """Seeded split of train into (train, validation) by distinct text, stratified by label
    (single-label) or at random (multi-label, regression): every copy of a text lands on the
    same side, so validation never repeats a train text. Returns the validation rows' mask."""
    first = keep.copy()  # a text's first kept row stands for it
    again = np.flatnonzero(keep & scan.repeated)
    first[again[pd.Series(scan.key[again]).duplicated().to_numpy()]] = False
    texts = np.flatnonzero(first)
    del first, again
    if not stratify:
        from sklearn.model_selection import train_test_split  # ~1-3 s to import: only here

        _, held = train_test_split(np.arange(len(texts)), random_state=seed,
                                   test_size=max(1, int(round(len(texts) * fraction))))
        return keep & isin(scan.key, scan.key[texts[held]])
    codes = scan.label[texts]
    per_class = np.bincount(codes, minlength=len(labels.values))
    classes = int((per_class > 0).sum())
    if ((per_class > 0) & (per_class < 2)).any():
        counts = pd.Series(objects([labels.values[c] for c in codes])).value_counts()
        few = counts[counts < 2]

        def one(label):
            rows = scan.row[keep & (scan.label == labels.codes[label])] + 1
            if len(rows) == 1:
                return f"{label!r} (1 row: data row {row_list(rows)})"
            return f"{label!r} ({len(rows)} rows, all the same text: data rows {row_list(rows)})"

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
                         f"{fraction:g} of {plural(len(texts), 'distinct text')} is "
                         f"{plural(n_val, 'validation row')}, fewer than the {classes} "
                         f"classes (each needs one); {fix}")
    # Codes ranked as their labels sort: the split then sees the classes in the order it would
    # see the label strings in, and draws the same rows.
    order = sorted(range(len(labels.values)), key=labels.values.__getitem__)
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    classes = rank[codes]
    del codes
    held = stratified_held(classes, n_val, seed)
    return keep & isin(scan.key, scan.key[texts[held]])


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
