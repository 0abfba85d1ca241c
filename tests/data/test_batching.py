import numpy as np
import pytest

from wellfed.data.batching import (BatchSpec, eval_batches, global_batches, iterate_steps,
                                   padded_width, steps_per_epoch)


@pytest.fixture
def lengths():
    rng = np.random.default_rng(7)
    return rng.integers(3, 60, size=1003)  # 1003: the last global batch is partial


def all_steps(lengths, spec, epochs=1):
    return [[s for s in iterate_steps(lengths, spec, r, epochs=epochs)] for r in range(spec.world_size)]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("tokens", [0, 300])
def test_every_row_exactly_once_per_epoch_and_budget_respected(lengths, world, tokens):
    spec = BatchSpec(global_batch=32, world_size=world, micro_rows=8, micro_tokens=tokens,
                     pad_multiple=1, seed=1, pool_batches=4)
    per_rank = all_steps(lengths, spec, epochs=2)
    assert len({len(s) for s in per_rank}) == 1  # same number of steps on every rank
    seen = {0: [], 1: []}
    for steps in zip(*per_rank):
        assert len({len(s.micro) for s in steps}) == 1  # same micro-batch count: DDP needs it
        assert sum(len(m) for s in steps for m in s.micro) == steps[0].global_rows
        for s in steps:
            for m in s.micro:
                seen[s.epoch] += m.tolist()
                assert len(m) <= 8
                if tokens and len(m) > 1:
                    assert len(m) * padded_width(lengths[m].max(), 1) <= tokens
    for epoch in (0, 1):
        assert sorted(seen[epoch]) == list(range(len(lengths)))  # each row once, none lost


def test_same_seed_same_batches_and_epochs_differ(lengths):
    spec = BatchSpec(global_batch=32, seed=5)
    a = [b.tolist() for b in global_batches(lengths, spec, 0)]
    b = [b.tolist() for b in global_batches(lengths, spec, 0)]
    c = [b.tolist() for b in global_batches(lengths, spec, 1)]
    assert a == b and a != c
    assert len(a) == steps_per_epoch(len(lengths), 32) == 32


def test_length_bucketing_keeps_padding_low(lengths):
    spec = BatchSpec(global_batch=32, micro_rows=32, seed=0, pool_batches=16)
    real = padded = 0
    for batch in global_batches(lengths, spec, 0):
        real += lengths[batch].sum()
        padded += len(batch) * lengths[batch].max()
    assert real / padded > 0.9  # random batches of uniform 3..59 lengths would be ~0.53


def test_ranks_get_balanced_token_loads(lengths):
    spec = BatchSpec(global_batch=64, world_size=4, micro_rows=64, seed=2)
    loads = np.zeros(4)
    for rank, steps in enumerate(all_steps(lengths, spec)):
        loads[rank] = sum(lengths[m].sum() for s in steps for m in s.micro)
    assert loads.max() / loads.min() < 1.05


def test_resume_continues_from_the_next_unseen_step(lengths):
    spec = BatchSpec(global_batch=32, world_size=2, micro_rows=8, seed=3)
    full = [(s.epoch, s.index, [m.tolist() for m in s.micro])
            for s in iterate_steps(lengths, spec, 1, epochs=2)]
    resumed = [(s.epoch, s.index, [m.tolist() for m in s.micro])
               for s in iterate_steps(lengths, spec, 1, start_epoch=0, start_index=20, epochs=2)]
    assert resumed == full[20:]
    assert len(full) == 64


def test_a_tiny_last_batch_gives_filler_not_repeats():
    lengths = np.array([5, 6, 7, 8, 9])  # global batch 4 -> last step has 1 row for 2 ranks
    spec = BatchSpec(global_batch=4, world_size=2, micro_rows=4)
    last = [list(iterate_steps(lengths, spec, r))[-1] for r in range(2)]
    sizes = sorted(len(m) for s in last for m in s.micro)
    assert sizes == [0, 1] and last[0].global_rows == 1


def test_eval_batches_cover_every_row_once_sorted(lengths):
    spec = BatchSpec(global_batch=1, world_size=2, micro_rows=50, micro_tokens=1000)
    rows = [i for r in range(2) for b in eval_batches(lengths, spec, r) for i in b.tolist()]
    assert sorted(rows) == list(range(len(lengths)))


def test_an_eval_batch_holds_rows_of_one_padded_width(lengths):
    """No row is padded to a longer neighbour's width: with exact widths (pad_multiple 1, a
    CPU) no eval batch has padding at all; with multiples of 8, each batch one multiple."""
    for multiple in (1, 8):
        spec = BatchSpec(global_batch=1, world_size=1, micro_rows=50, pad_multiple=multiple)
        batches = eval_batches(lengths, spec, 0)
        assert sorted(i for b in batches for i in b.tolist()) == list(range(len(lengths)))
        for b in batches:
            assert len({spec.width(n) for n in lengths[b]}) == 1
            assert len(b) <= 50
    exact = eval_batches(lengths, BatchSpec(global_batch=1, world_size=1, micro_rows=50), 0)
    assert all(len(set(lengths[b].tolist())) == 1 for b in exact)
    assert eval_batches(np.zeros(0, np.int64), BatchSpec(global_batch=1, world_size=1), 0) == []
