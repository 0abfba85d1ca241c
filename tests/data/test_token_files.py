import errno

import numpy as np
import pyarrow as pa
import pytest

from wellfed.data.token_files import TokenBatch, TokenFile, write_token_file


def make_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 30000, size=rng.integers(1, 40), dtype=np.int32) for _ in range(n)]


def batches_of(rows, size):
    for start in range(0, len(rows), size):
        chunk = rows[start:start + size]
        yield TokenBatch(np.concatenate(chunk), np.array([len(r) for r in chunk], np.int32),
                         np.arange(start, start + len(chunk)) % 3,
                         np.arange(start, start + len(chunk)) + 1000)


def test_round_trip_gives_the_same_ids_from_a_single_record_batch(tmp_path):
    rows = make_rows(1000)
    path = tmp_path / "train.arrow"
    assert write_token_file(path, batches_of(rows, 97), {"k": "v"}) == 1000
    reader = pa.ipc.open_file(pa.memory_map(str(path)))
    assert reader.num_record_batches == 1  # many writer batches, one record batch on disk
    tf = TokenFile(path)
    assert len(tf) == 1000 and tf.metadata == {"k": "v"}
    checked = 0
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(tf.row(i), row)
        checked += 1
    assert checked == 1000
    assert tf.row_ids[5] == 1005 and tf.labels[5] == 5 % 3
    assert not (tmp_path / "train.arrow.values").exists()  # the scratch file is gone


def test_open_is_zero_copy_memory_mapped(tmp_path):
    path = tmp_path / "t.arrow"
    write_token_file(path, batches_of(make_rows(200), 50))
    before = pa.total_allocated_bytes()
    tf = TokenFile(path)
    assert pa.total_allocated_bytes() - before < 64 * 200  # only the small offsets copy is allowed
    assert not tf.values.flags.owndata and not tf.values.flags.writeable  # a view on the mmap


def test_gather_pads_and_masks_exactly(tmp_path):
    rows = make_rows(300, seed=3)
    path = tmp_path / "t.arrow"
    write_token_file(path, batches_of(rows, 64))
    tf = TokenFile(path)
    idx = np.array([5, 17, 0, 299, 17])
    out = tf.gather(idx, pad_id=0, pad_multiple=8)
    width = max(len(rows[i]) for i in idx)
    assert out["input_ids"].shape == (5, -(-width // 8) * 8)
    for k, i in enumerate(idx):
        n = len(rows[i])
        np.testing.assert_array_equal(out["input_ids"][k, :n], rows[i])
        assert (out["input_ids"][k, n:] == 0).all()
        assert out["attention_mask"][k].sum() == n and out["attention_mask"][k, :n].all()
    np.testing.assert_array_equal(out["labels"], idx % 3)


def test_empty_split_and_missing_file(tmp_path):
    path = tmp_path / "e.arrow"
    assert write_token_file(path, iter([])) == 0
    assert len(TokenFile(path)) == 0
    with pytest.raises(FileNotFoundError, match="run the tokenize stage"):
        TokenFile(tmp_path / "nope.arrow")
    (tmp_path / "junk.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(ValueError, match="not an Arrow IPC token file"):
        TokenFile(tmp_path / "junk.arrow")


def test_offsets_are_64_bit_so_no_split_is_too_large(tmp_path):
    """large_list offsets: a split past 2^31 tokens (~20M rows of 100 tokens) still fits."""
    path = tmp_path / "t.arrow"
    write_token_file(path, batches_of(make_rows(50), 20))
    schema = pa.ipc.open_file(pa.memory_map(str(path))).schema
    assert schema.field("input_ids").type == pa.large_list(pa.int32())
    tf = TokenFile(path)
    assert tf.offsets.dtype == np.int64


def test_files_with_32_bit_list_offsets_still_read(tmp_path):
    rows = make_rows(30)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(rows)))
    batch = pa.record_batch([ids, pa.array(np.zeros(30, np.int64)),
                             pa.array(np.array([len(r) for r in rows], np.int32)),
                             pa.array(np.arange(30, dtype=np.int64))],
                            names=["input_ids", "label", "length", "row_id"])
    path = tmp_path / "old.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    tf = TokenFile(path)
    np.testing.assert_array_equal(tf.gather(np.array([3, 7]), 0)["input_ids"][1, :len(rows[7])], rows[7])


def reference(path, rows, labels, row_ids, segments=None):
    """The same split written by Arrow from memory in one go: what the streaming writer must
    produce byte for byte."""
    lengths = np.array([len(r) for r in rows], np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(rows), pa.int32()))
    label = (pa.array(labels) if labels.ndim == 1 else
             pa.FixedSizeListArray.from_arrays(pa.array(labels.ravel()), labels.shape[1]))
    columns = [ids, label, pa.array(lengths), pa.array(row_ids)]
    names = ["input_ids", "label", "length", "row_id"]
    if segments is not None:
        columns.append(pa.array(segments))
        names.append("segment")
    batch = pa.record_batch(columns, names=names)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(
            sink, batch.schema.with_metadata({"k": "v"})) as writer:
        writer.write_batch(batch)
    return path.read_bytes()


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_the_file_is_what_arrow_writes_from_memory_with_the_columns_copied_by_the_kernel(
        tmp_path, monkeypatch, kernel_copy):
    import os

    rows = make_rows(500, seed=5)
    labels = np.random.default_rng(1).random((500, 3)).astype(np.float32)  # multi-hot/targets
    segments = np.array([len(r) // 2 for r in rows], np.int32)
    copied, copy = [], os.copy_file_range

    def counting(src, dst, count, offset_src=None, offset_dst=None):
        if not kernel_copy:  # as on a system without copy_file_range
            raise OSError(errno.ENOSYS, "not here")
        done = copy(src, dst, count, offset_src, offset_dst)
        copied.append(done)
        return done

    monkeypatch.setattr(os, "copy_file_range", counting)
    batches = (TokenBatch(np.concatenate(rows[s:s + 64]), np.array([len(r) for r in rows[s:s + 64]],
                                                                     np.int32),
                          labels[s:s + 64], np.arange(s, s + len(rows[s:s + 64])) + 7,
                          segments[s:s + 64]) for s in range(0, 500, 64))
    path = tmp_path / "t.arrow"
    assert write_token_file(path, batches, {"k": "v"}) == 500
    assert path.read_bytes() == reference(tmp_path / "ref.arrow", rows, labels,
                                          np.arange(500) + 7, segments)
    tokens = sum(len(r) for r in rows)
    # Every column came file to file: ids, offsets, labels, lengths, row ids, segments.
    assert sum(copied) == (4 * tokens + 8 * 501 + 12 * 500 + 4 * 500 + 8 * 500 + 4 * 500
                           if kernel_copy else 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.arrow", "t.arrow"]  # no scratch
    tf = TokenFile(path)
    np.testing.assert_array_equal(tf.labels[17], labels[17])
    assert tf.segments[17] == segments[17]


def test_length_stats_from_the_histogram_equal_numpy_on_the_lengths():
    from wellfed.data.tokenization import token_stats

    rng = np.random.default_rng(0)
    checked = 0
    for n in (1, 2, 3, 7, 100, 1001, 25_000):
        lengths = rng.integers(1, 129, n)
        p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
        stats = token_stats(np.bincount(lengths, minlength=129), 4)
        assert {type(v) for v in stats.values()} == {int, float}  # plain JSON numbers
        assert stats == {
            "rows": n, "tokens": int(lengths.sum()),
            "length_mean": round(float(lengths.mean()), 2), "length_p50": round(float(p50), 2),
            "length_p90": round(float(p90), 2), "length_p99": round(float(p99), 2),
            "length_max": int(lengths.max()), "truncated_rows": 4}
        checked += 1
    assert checked == 7
