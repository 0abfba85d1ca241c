"""Fused trials of different seeds (train/trials/apart.py, the final check's finalists x
seeds) against the same trials trained alone, on this CPU in float32: each trial with its own
data order, dropout masks and head init learns what it learns alone, step for step, for every
task; a token budget that cuts each seed's batches into a different number of micro-batches
changes nothing; a group stopped at a rung goes on as if never stopped; and the padding the
group pays for its trials' own batches is counted."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from tests.train.test_trials import (BASE, CPU, RECIPES, alone, assert_same,
                                     each_as_alone, job_for, stopped_and_resumed, token_dir)
from wellfed.train.trials import apart
from wellfed.train.trials import group as trial_group

SEEDS = [5, 6, 5]
"""Two trials of one seed (sharing their batches) and one of another."""


def configs_of(**train):
    return [dataclasses.replace(BASE, seed=seed, **recipe, **train)
            for seed, recipe in zip(SEEDS, RECIPES)]


@pytest.mark.parametrize("task,pairs", [("single_label", False), ("multi_label", False),
                                        ("regression", False), ("single_label", True)],
                         ids=["single_label", "multi_label", "regression", "pairs"])
def test_trials_of_different_seeds_learn_in_one_group_what_they_learn_alone(
        tmp_path, tiny_model_dir, task, pairs):
    tokens = token_dir(tmp_path / "tokens", task, pairs)
    configs = configs_of()
    job = job_for(tokens, tiny_model_dir, task)
    run = trial_group.train_group(job, configs, CPU, validate_at=frozenset({3}))
    each_as_alone(job, configs, run)
    # the trials' own batches differ, so the group computed more than they would alone
    assert run.tokens["computed"] > run.tokens["alone"] >= run.tokens["real"] > 0


def test_a_token_budget_that_cuts_each_seeds_batches_differently_changes_nothing(
        tmp_path, tiny_model_dir):
    """At 24 tokens a micro-batch, the 8 rows of a step (3-13 tokens each) are cut into 3 to 6
    micro-batches depending on the seed's order: a trial without an i-th one sits it out."""
    tokens = token_dir(tmp_path / "tokens", "single_label")
    configs = configs_of(micro_batch_tokens=24)
    job = job_for(tokens, tiny_model_dir, "single_label", micro_batch_tokens=24)
    cut = {}
    for seed in (5, 6):
        from wellfed.data.batching import BatchSpec, iterate_steps
        from wellfed.data.token_files import TokenFile

        spec = BatchSpec(global_batch=8, world_size=1, micro_rows=4, micro_tokens=24,
                         pad_multiple=1, seed=seed, pool_batches=BASE.pool_batches)
        lengths = TokenFile(tokens / "train.arrow").lengths
        cut[seed] = [len(s.micro) for s in iterate_steps(lengths, spec, 0, 0, 0, 2)][:6]
    assert cut[5] != cut[6], cut  # the case this test is for
    run = trial_group.train_group(job, configs, CPU)
    for k, cfg in enumerate(configs):
        losses, _ = alone(dataclasses.replace(job, train=cfg))
        assert_same([r["loss"] for r in run.history[k]], losses, f"trial {k} (seed {cfg.seed})")
    # A halving at step 2 drops seed 6's only trial; its step 3 has more micro-batches than
    # seed 5's, which the survivors then neither wait for nor gather.
    assert cut[6][2] > cut[5][2], cut
    halved = trial_group.train_group(job, configs, CPU, validate_at=frozenset({2}),
                                     decide=lambda step, figures: [2, 0])
    assert halved.steps == {0: 6, 1: 2, 2: 6}
    for k in (0, 2):
        assert_same([r["loss"] for r in halved.history[k]], [r["loss"] for r in run.history[k]],
                    f"survivor {k}")


def test_a_group_of_different_seeds_stopped_at_a_rung_goes_on_as_if_never_stopped(
        tmp_path, tiny_model_dir):
    """Each trial's own random state and data order are in the saved state: the group started
    again goes on from the rung with the same losses and figures, to every digit, after a
    halving that dropped the trial in the middle."""
    tokens = token_dir(tmp_path / "tokens", "single_label")
    configs = configs_of(max_steps=8)
    job = job_for(tokens, tiny_model_dir, "single_label", max_steps=8)
    rungs = frozenset({2, 5})
    whole, again = stopped_and_resumed(job, configs, rungs, 5, tmp_path / "group.pt")
    assert again.resumed_at == 2 and again.steps == whole.steps == {0: 8, 1: 2, 2: 8}
    for k in range(3):
        assert [r["loss"] for r in again.history[k]] == [r["loss"] for r in whole.history[k]]
        assert again.validations[k] == whole.validations[k]
    losses, _ = alone(dataclasses.replace(job, train=configs[2]), rungs)
    assert_same([r["loss"] for r in whole.history[2]], losses, "survivor of seed 5")


def test_a_state_saved_for_other_seeds_is_not_gone_on_from(tmp_path, tiny_model_dir):
    """A group file names its trials by place: the same places with other seeds (search.seeds
    changed) start afresh instead of going on from another seed's state."""
    tokens = token_dir(tmp_path / "tokens", "single_label")
    job = job_for(tokens, tiny_model_dir, "single_label")
    saved = tmp_path / "group.pt"
    configs = configs_of()
    first = trial_group.train_group(job, configs, CPU, validate_at=frozenset({3}), saved=saved)
    assert saved.is_file() and first.resumed_at == 0
    again = trial_group.train_group(job, configs, CPU, validate_at=frozenset({3}), saved=saved)
    assert again.resumed_at == 3
    other = [dataclasses.replace(c, seed=c.seed + 10) for c in configs]
    assert trial_group.train_group(job, other, CPU, validate_at=frozenset({3}),
                                   saved=saved).resumed_at == 0


def test_trials_own_batches_are_stacked_to_one_shape_with_their_own_regions():
    def host(rows, width, padded):
        mask = np.ones((rows, width), np.int64)
        if padded:
            mask[0, -1] = 0
        return {"input_ids": np.full((rows, width), 7), "attention_mask": mask,
                "labels": np.arange(rows), "weights": np.ones(rows, np.float32)}

    batch, own, masked = apart.stacked([host(2, 5, True), None, host(3, 4, False)], pad_id=0)
    assert batch["input_ids"].shape == (9, 5) and own == [(2, 5), (0, 0), (3, 4)]
    assert masked == [True, False, False]
    assert batch["weights"].tolist() == [1, 1, 0, 0, 0, 0, 1, 1, 1]
    # filler rows attend their first token only (finite attention), wider rows pad with 0s
    assert batch["attention_mask"][3].tolist() == [1, 0, 0, 0, 0]
    assert batch["attention_mask"][6].tolist() == [1, 1, 1, 1, 0]
    assert batch["input_ids"][6].tolist() == [7, 7, 7, 7, 0]
    # as loader processes hand them over (data.loader_workers): CPU tensors, the same batch
    as_tensors = [None if h is None else {k: torch.from_numpy(np.asarray(v)) for k, v in h.items()}
                  for h in (host(2, 5, True), None, host(3, 4, False))]
    again, own_again, _ = apart.stacked(as_tensors, pad_id=0)
    assert own_again == own and all((again[k] == batch[k]).all() for k in batch)


def test_each_trials_stream_draws_what_its_seed_draws_alone():
    streams = apart.Streams.seeded([3, 4], torch.device("cpu"))
    torch.manual_seed(99)
    with streams.use(1):
        a = torch.rand(3)
    with streams.use(0):
        b = torch.rand(3)
    with streams.use(1):
        c = torch.rand(3)
    torch.manual_seed(4)
    assert torch.equal(torch.cat([a, c]), torch.rand(6))
    torch.manual_seed(3)
    assert torch.equal(b, torch.rand(3))


def test_a_trials_own_region_follows_the_layout_it_drops_out():
    from wellfed.train.trials.layers import region

    shapes = {2: (4, 8), 3: (4, 6, 8), 4: (4, 2, 6, 6)}
    own = {2: (3, 8), 3: (3, 5, 8), 4: (3, 2, 5, 5)}  # rows 3, width 5 of 4 x 6
    for ndim, shape in shapes.items():
        assert torch.zeros(shape)[region(torch.zeros(shape), (3, 5))].shape == own[ndim]
    with pytest.raises(ValueError, match="5 dimensions"):
        region(torch.zeros(1, 1, 1, 1, 1), (1, 1))


ENCODERS = {  # tiny random-init configs of other encoder families (BERT is tiny_model_dir's)
    "roberta": {"architectures": ["RobertaForSequenceClassification"], "model_type": "roberta",
                "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 64, "max_position_embeddings": 514, "vocab_size": 30522,
                "type_vocab_size": 1, "pad_token_id": 0, "hidden_dropout_prob": 0.1,
                "attention_probs_dropout_prob": 0.1},
    "distilbert": {"architectures": ["DistilBertForSequenceClassification"],
                   "model_type": "distilbert", "dim": 32, "n_layers": 2, "n_heads": 2,
                   "hidden_dim": 64, "vocab_size": 30522, "pad_token_id": 0, "dropout": 0.1,
                   "attention_dropout": 0.1, "seq_classif_dropout": 0.2},
    "electra": {"architectures": ["ElectraForSequenceClassification"], "model_type": "electra",
                "hidden_size": 32, "embedding_size": 16, "num_hidden_layers": 2,
                "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 30522,
                "pad_token_id": 0, "hidden_dropout_prob": 0.1,
                "attention_probs_dropout_prob": 0.1},
}


@pytest.mark.parametrize("family", sorted(ENCODERS))
def test_other_encoder_families_learn_across_seeds_what_they_learn_alone(tmp_path,
                                                                        tiny_model_dir, family):
    model_dir = tmp_path / family
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "config.json").write_text(json.dumps(ENCODERS[family]))
    tokens = token_dir(tmp_path / "tokens", "single_label")
    configs = configs_of()
    job = job_for(tokens, model_dir, "single_label")
    run = trial_group.train_group(job, configs, CPU)
    for k, cfg in enumerate(configs):
        losses, _ = alone(dataclasses.replace(job, train=cfg))
        assert_same([r["loss"] for r in run.history[k]], losses, f"{family} trial {k}")
