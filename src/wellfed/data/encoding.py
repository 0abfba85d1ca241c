"""The second pass: a split's final rows read back from the first pass's scratch file, the
drops applied and the labels encoded (class ids, multi-hot vectors or regression targets)."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from wellfed.data.scan import LabelCodes, Scan

OUT_ROWS = 65_536  # rows per frame of the second pass (~10 MB of 100-character texts)


def encoded_frames(scan: Scan, mask: np.ndarray, names: list[str], labels: LabelCodes,
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
