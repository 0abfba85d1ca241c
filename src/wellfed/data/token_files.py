"""The token-file format: one Arrow IPC file per split, a single record batch, memory-mapped.

Columns: `input_ids` large_list<int32> (no padding; 64-bit offsets, so a split holds any number
of tokens: a 32-bit list stops at 2^31, ~20M rows of 100 tokens), `label` int64 (a class id) or
fixed_size_list<float32>[K] (multi-hot labels, regression targets), `length` int32, `row_id`
int64, and for sentence pairs on models with token types `segment` int32 (where the second
segment starts). Files written with 32-bit list offsets read the same.

Writing streams every column to a scratch file first, so memory stays bounded by one tokenizer
batch however many rows and tokens there are, then emits the whole split as ONE record batch
whose buffers are those scratch files, copied into the IPC file by the kernel. One record batch
means one flat offsets array and one flat values array: gathering a batch of rows is pure numpy
indexing, with no per-chunk work (a multi-chunk `ChunkedArray.take` was measured at 26
batches/s versus ~11,000 for vectorized offsets).
"""

from __future__ import annotations

import errno
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np
import pyarrow as pa

COPY_BYTES = 16 * 2**20  # a chunk of a scratch file when the kernel cannot copy it itself


class TokenBatch(NamedTuple):
    values: np.ndarray  # int32, the rows' token ids back to back
    lengths: np.ndarray  # int32, tokens per row
    labels: np.ndarray  # int64 class ids, or float32 (rows, K): multi-hot labels / targets
    row_ids: np.ndarray  # int64
    segments: np.ndarray | None = None  # int32, where a pair's second segment starts


def write_token_file(path: str | Path, batches: Iterable[TokenBatch],
                     metadata: dict[str, str] | None = None) -> int:
    """Stream `batches` into one single-record-batch Arrow IPC file at `path`; return rows."""
    path = Path(path)
    scratch = {name: path.with_name(f"{path.name}.{name}")
               for name in ("values", "lengths", "labels", "row_ids", "segments", "offsets")}
    try:
        with ExitStack() as files:
            out = {name: files.enter_context(open(file, "wb")) for name, file in scratch.items()}
            rows, tokens, width, pairs = 0, 0, None, False
            for batch in batches:
                labels = np.asarray(batch.labels)
                width = width if width is not None else (0 if labels.ndim == 1 else labels.shape[1])
                np.ascontiguousarray(batch.values, np.int32).tofile(out["values"])
                np.ascontiguousarray(batch.lengths, np.int32).tofile(out["lengths"])
                np.ascontiguousarray(labels, np.float32 if width else np.int64).tofile(out["labels"])
                np.ascontiguousarray(batch.row_ids, np.int64).tofile(out["row_ids"])
                if batch.segments is not None:
                    pairs = True
                    np.ascontiguousarray(batch.segments, np.int32).tofile(out["segments"])
                rows, tokens = rows + len(batch.lengths), tokens + int(np.sum(batch.lengths,
                                                                              dtype=np.int64))
        _write_offsets(scratch["lengths"], scratch["offsets"])
        columns = {name: _mapped(file) for name, file in scratch.items()}
        values = pa.Array.from_buffers(pa.int32(), tokens, [None, columns["values"]])
        ids = pa.Array.from_buffers(pa.large_list(pa.int32()), rows, [None, columns["offsets"]],
                                    children=[values])
        label = (pa.Array.from_buffers(pa.int64(), rows, [None, columns["labels"]]) if not width
                 else pa.FixedSizeListArray.from_arrays(pa.Array.from_buffers(
                     pa.float32(), rows * width, [None, columns["labels"]]), width))
        arrays = [ids, label, pa.Array.from_buffers(pa.int32(), rows, [None, columns["lengths"]]),
                  pa.Array.from_buffers(pa.int64(), rows, [None, columns["row_ids"]])]
        names = ["input_ids", "label", "length", "row_id"]
        if pairs:
            arrays.append(pa.Array.from_buffers(pa.int32(), rows, [None, columns["segments"]]))
            names.append("segment")
        table = pa.record_batch(arrays, names=names)
        schema = table.schema.with_metadata(metadata or {})
        with open(path, "wb", buffering=0) as sink:
            copier = _KernelCopy(sink, [(columns[name], scratch[name]) for name in columns])
            # allow_64bit: without it Arrow refuses a column past 2^31 - 1 values (the token
            # ids of a split past 2^31 tokens), whatever its offsets' width.
            options = pa.ipc.IpcWriteOptions(allow_64bit=True)
            with pa.ipc.new_file(pa.PythonFile(copier, mode="w"), schema,
                                 options=options) as writer:
                writer.write_batch(table)
        return rows
    finally:
        for file in scratch.values():
            file.unlink(missing_ok=True)


def _write_offsets(lengths: Path, offsets: Path, chunk: int = 4 * 2**20) -> None:
    """Row offsets (int64, rows + 1) from the lengths file, a chunk at a time."""
    with open(lengths, "rb") as src, open(offsets, "wb") as out:
        total = np.zeros(1, np.int64)
        total.tofile(out)
        while len(part := np.fromfile(src, np.int32, chunk)):
            ends = np.cumsum(part, dtype=np.int64) + total[0]
            ends.tofile(out)
            total[0] = ends[-1]


def _mapped(file: Path) -> pa.Buffer:
    """The file as a buffer without reading it (pages come in only if something touches them)."""
    size = file.stat().st_size
    return pa.py_buffer(np.memmap(file, np.uint8, "r")) if size else pa.py_buffer(b"")


class _KernelCopy:
    """The file Arrow's IPC writer writes into. Metadata and padding come as bytes and are
    written as they are; a column comes as a buffer over its memory-mapped scratch file and is
    copied from that file by the kernel (os.copy_file_range), so its pages never enter this
    process. Arrow writing straight from the maps faulted every page in: the peak RSS grew by
    the size of the token file (12 GB for 3B tokens)."""

    def __init__(self, sink, sources: list[tuple[pa.Buffer, Path]]):
        self.sink, self.position, self.closed = sink, 0, False
        self.sources = [(buf.address, buf.size, file) for buf, file in sources if buf.size]

    def write(self, data) -> int:
        if isinstance(data, pa.Buffer):
            for address, size, file in self.sources:
                if address <= data.address and data.address + data.size <= address + size:
                    self._copy(file, data.address - address, data.size)
                    self.position += data.size
                    return data.size
        view = memoryview(data).cast("B")
        while view:  # one write(2) may take less than asked (at most ~2 GB)
            view = view[self.sink.write(view):]
        self.position += len(memoryview(data).cast("B"))
        return len(memoryview(data).cast("B"))

    def _copy(self, file: Path, offset: int, size: int) -> None:
        with open(file, "rb", buffering=0) as src:
            done = 0
            try:
                while done < size:
                    step = os.copy_file_range(src.fileno(), self.sink.fileno(), size - done,
                                              offset + done)
                    if step == 0:
                        raise OSError(errno.EIO, f"{file}: ended before {size} bytes were copied")
                    done += step
            except (AttributeError, OSError) as err:  # no copy_file_range here: copy by chunks
                if isinstance(err, OSError) and err.errno not in (
                        errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                while done < size:
                    piece = os.pread(src.fileno(), min(COPY_BYTES, size - done), offset + done)
                    self.sink.write(piece)
                    done += len(piece)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def mode(self) -> str:
        return "wb"


class TokenFile:
    """Zero-copy, memory-mapped view of a token file with vectorized batch gathering."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: token file not found; run the tokenize stage "
                                    "(dvc repro tokenize)")
        source = pa.memory_map(str(self.path), "r")
        try:
            reader = pa.ipc.open_file(source)
        except pa.ArrowInvalid as err:
            raise ValueError(f"{self.path}: not an Arrow IPC token file ({err}); rerun the "
                             "tokenize stage") from None
        self.metadata = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
        if reader.num_record_batches == 1:
            batch = reader.get_batch(0)
        else:  # written by another tool: one copy now so that gathering stays flat later
            batch = reader.read_all().combine_chunks().to_batches()[0]
        ids = batch.column("input_ids")
        self.offsets = ids.offsets.to_numpy(zero_copy_only=True)
        self.values = ids.values.to_numpy(zero_copy_only=True)
        self.lengths = batch.column("length").to_numpy(zero_copy_only=True)
        label = batch.column("label")
        self.labels = (label.to_numpy(zero_copy_only=True) if not pa.types.is_fixed_size_list(label.type)
                       else label.flatten().to_numpy(zero_copy_only=True).reshape(len(label), -1))
        self.row_ids = batch.column("row_id").to_numpy(zero_copy_only=True)
        names = batch.schema.names
        self.segments = (batch.column("segment").to_numpy(zero_copy_only=True)
                         if "segment" in names else None)

    def __len__(self) -> int:
        return len(self.lengths)

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    def gather(self, idx: np.ndarray, pad_id: int, pad_multiple: int = 1,
               width: int | None = None) -> dict[str, np.ndarray]:
        """Padded `input_ids`, `attention_mask`, `labels` for rows `idx`, without per-row Python:
        `width` wide (at least the longest row), else the longest row rounded up to
        `pad_multiple`."""
        idx = np.asarray(idx, np.int64)
        lens = self.lengths[idx].astype(np.int64)
        longest = int(lens.max()) if len(idx) else 1
        if width is None:
            width = -(-longest // pad_multiple) * pad_multiple
        elif width < longest:
            raise ValueError(f"gather: a row of {longest} tokens does not fit width {width}")
        row_of = np.repeat(np.arange(len(idx)), lens)
        first = np.cumsum(lens) - lens
        pos = np.arange(int(lens.sum())) - np.repeat(first, lens)
        input_ids = np.full((len(idx), width), pad_id, np.int64)
        input_ids[row_of, pos] = self.values[np.repeat(self.offsets[idx], lens) + pos]
        columns = np.arange(width)[None, :]
        mask = (columns < lens[:, None]).astype(np.int64)
        labels = self.labels[idx]
        batch = {"input_ids": input_ids, "attention_mask": mask,
                 "labels": labels.astype(np.int64) if labels.ndim == 1 else labels}
        if self.segments is not None:  # a pair for a model with token types (BERT-style)
            batch["token_type_ids"] = ((columns >= self.segments[idx, None]) & (mask == 1)
                                       ).astype(np.int64)
        return batch
