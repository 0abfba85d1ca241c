"""A winner at the edge of its range is said in one line with the range to try next (log scale
for log ranges); one inside its range, or against a bound the key itself keeps, is not."""

from __future__ import annotations

from wellfed.config.search import Dimension
from wellfed.search.edges import at_edges, position

LR = Dimension("train.lr", "log_uniform", 1e-5, 3e-4)
WARMUP = Dimension("train.warmup_ratio", "uniform", 0.0, 0.2)
DECAY = Dimension("train.weight_decay", "choice", choices=(0.0, 0.01, 0.1))
DIMS = [LR, WARMUP, DECAY]


def test_the_issues_winner_at_the_top_of_a_log_range_is_said_with_the_range_to_try():
    # lr 2.89e-4 in log_uniform 1e-5 3e-4, from a real many-class search: 98.9% up on a log
    # scale (64% of the way on a linear one would not flag a winner at 1.5e-4 either way)
    lines = at_edges(DIMS, {"train.lr": 2.89e-4, "train.warmup_ratio": 0.1,
                            "train.weight_decay": 0.1})
    assert lines == ["the winner's train.lr 0.000289 is within 1% of the top of its range "
                     "(log_uniform 1e-05 0.0003 on a log scale): a better recipe may lie "
                     "beyond it; try search.space.train.lr: log_uniform 5.3e-05 0.0016"]


def test_a_winner_inside_its_ranges_says_nothing():
    assert at_edges(DIMS, {"train.lr": 1e-4, "train.warmup_ratio": 0.1,
                           "train.weight_decay": 0.0}) == []
    # 2.5e-5 is 27% up the log range, though 5% up a linear one: the log scale decides
    assert round(position(LR, 2.5e-5), 2) == 0.27
    assert at_edges(DIMS, {"train.lr": 2.5e-5}) == []


def test_the_bottom_edge_and_a_linear_range():
    lines = at_edges(DIMS, {"train.lr": 1.05e-5, "train.warmup_ratio": 0.195})
    assert len(lines) == 2
    assert lines[0].startswith("the winner's train.lr 1.05e-05 is within 1% of the bottom")
    assert lines[0].endswith("try search.space.train.lr: log_uniform 1.9e-06 5.8e-05")
    assert lines[1] == ("the winner's train.warmup_ratio 0.195 is within 3% of the top of its "
                        "range (uniform 0 0.2): a better recipe may lie beyond it; try "
                        "search.space.train.warmup_ratio: uniform 0.095 0.295")


def test_an_edge_the_key_itself_keeps_is_not_said():
    # warmup_ratio cannot go below 0: a winner at 0.001 is where the key allows, not cut short
    assert at_edges(DIMS, {"train.warmup_ratio": 0.001}) == []
