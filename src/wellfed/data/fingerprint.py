"""What a split is, in one hash: its row ids, texts and labels (by name), whatever the tokenizer.

Two models evaluated on splits with the same fingerprint scored the same rows against the same
gold labels, so their test figures can be ranked (the registry's champion alias,
wellfed.track.registry). Token ids are no use for this: another tokenizer gives the same rows other ids.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

COLUMNS = ("row_id", "text", "text_pair", "label")
"""The prepared split's columns that define it (data/prepare.py writes them)."""


def split_fingerprint(parquet_path: str | Path, label_names: list[str]) -> str:
    """sha256 over the label names (ids mean nothing without them) and, row by row, the hash of
    (row_id, text[, text_pair], label): the same for the same content however the file's row
    groups fall."""
    digest = hashlib.sha256(json.dumps([str(n) for n in label_names]).encode())
    source = pq.ParquetFile(str(parquet_path))
    columns = [c for c in COLUMNS if c in source.schema_arrow.names]
    digest.update(json.dumps(columns).encode())
    for batch in source.iter_batches(batch_size=65536, columns=columns):
        frame = pd.DataFrame({name: plain(batch.column(name)) for name in columns})
        digest.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return digest.hexdigest()


def plain(column: pa.Array) -> np.ndarray:
    """A column pandas can hash: lists (multi-label ids, several regression targets) as JSON."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return np.array([json.dumps(v) for v in column.to_pylist()], dtype=object)
    return column.to_numpy(zero_copy_only=False)
