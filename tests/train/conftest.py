"""Fixtures the training tests share."""

import numpy as np
import pytest

from wellfed.data.shards import TokenBatch, write_token_file


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    """203 rows of 2-24 random token ids, alternating labels 0/1."""
    rng = np.random.default_rng(0)
    rows = [rng.integers(1000, 3000, size=rng.integers(2, 25), dtype=np.int32) for _ in range(203)]
    path = tmp_path_factory.mktemp("tok") / "train.arrow"
    write_token_file(path, [TokenBatch(np.concatenate(rows), np.array([len(r) for r in rows], np.int32),
                                       np.arange(203) % 2, np.arange(203))])
    return path
