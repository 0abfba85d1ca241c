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
    held = stratified_held(codes, n_val, seed)
    return keep & isin(scan.key, scan.key[texts[held]])


def stratified_held(classes: np.ndarray, n_held: int, seed: int) -> np.ndarray:
    """The positions of `n_held` of the rows whose classes (small ints) are `classes`, each
    class holding out its share (see `held_per_class`), its rows drawn at random. The same
    classes and seed give the same rows; ascending order."""
    if not 0 <= n_held <= len(classes):
        raise ValueError(f"cannot hold out {n_held} of {len(classes)} rows")
    rng = np.random.default_rng(seed)
    counts = np.bincount(classes)
    per_class = held_per_class(counts, n_held, rng)
    # One stable sort (8 bytes a row) instead of a mask per class: rows of class 0, 1, ...
    by_class = np.argsort(classes, kind="stable")
    ends = np.cumsum(counts)
    held = [rng.choice(by_class[end - count:end], take, replace=False)
            for count, end, take in zip(counts, ends, per_class) if take]
    return np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)


def held_per_class(counts: np.ndarray, n_held: int, rng: np.random.Generator) -> np.ndarray:
    """How many rows each class holds out, `n_held` in all, by largest remainder: each class
    gets the whole part of its exact share n_held x count / total, then the classes with the
    largest remainders (ties in a random order) one more each until the sum is n_held. A class
    of 2 or more rows is passed over while one more would hold out all of its rows, unless no
    other class can take the row (n_held near the total)."""
    total = int(counts.sum())
    # Shares times the total, in integers: equal remainders compare equal (floats may not).
    exact = n_held * counts.astype(np.int64)
    held = exact // max(total, 1)
    order = np.lexsort((rng.permutation(len(counts)), -(exact % max(total, 1))))
    keeps_one = np.where(counts >= 2, counts - 1, counts)
    left = n_held - int(held.sum())  # fewer than the number of classes
    for limit in (keeps_one, counts):
        while left:
            room = order[held[order] < limit[order]][:left]
            if not len(room):
                break
            held[room] += 1
            left -= len(room)
    return held
