"""Wherever a search names its winner, the proven figure (the mean over the final check's
seeds) comes first, and the search's single-seed figure is said as such."""

from __future__ import annotations

from wellfed.search import report

M = "val/macro_f1"
WIN = {"train.lr": 2.89e-4}
OTHER = {"train.lr": 1e-4}
# the search: the best trial 0.5692 on one seed; its proof runs 0.2473 and 0.2870
BEST = {"trial": "4fd73c57", "recipe": WIN, "step": 188, "value": 0.5692}
CHECK = {"finalists": [
    {"recipe": WIN, "mean": 0.26716, "sd": 0.0281,
     "runs": [{"seed": 1, M: 0.2473}, {"seed": 2, M: 0.2870}]},
    {"recipe": OTHER, "mean": 0.2, "sd": 0.01, "runs": [{"seed": 1, M: 0.19}, {"seed": 2, M: 0.21}]}],
    "winner": WIN, "text": "the winner (...) and the runner-up (...) are indistinguishable",
    "edges": ["the winner's train.lr 0.000289 is within 1% of the top of its range"],
    "call": "indistinguishable", "diff": 0.067}
COST = {"trials": 16, "planned_trials": 16, "stopped_early": 13, "steps": 752,
        "grid_steps": 3008, "share_of_grid": 0.25}


def test_the_winner_leads_with_its_mean_over_seeds():
    said = report.winner(M, BEST, CHECK)
    assert said == ("train.lr=0.000289: val/macro_f1 0.2672 ± 0.0281, the mean over seeds 1, 2 "
                    "(final check, validation split); in the search, its trial 4fd73c57 scored "
                    "0.5692 at step 188 on one seed")
    assert said.index("0.2672") < said.index("0.5692")


def test_a_winner_that_was_not_the_searchs_best_trial_names_both():
    other = {**BEST, "recipe": OTHER, "trial": "9e8d7c6b"}
    said = report.winner(M, other, CHECK)
    assert said.startswith("train.lr=0.000289: val/macro_f1 0.2672")
    assert "the best trial 9e8d7c6b (train.lr=0.0001) scored 0.5692" in said


def test_the_parent_runs_description_and_figures_lead_with_the_proven_winner():
    text = report.describe("s-1", M, BEST, COST, CHECK)
    lines = text.splitlines()
    assert lines[2].startswith("**Winner:** train.lr=0.000289: val/macro_f1 0.2672 ± 0.0281")
    assert lines[3] == ("**At the edge:** the winner's train.lr 0.000289 is within 1% of the "
                        "top of its range.")
    figures = report.metrics(COST, BEST, CHECK, M)
    assert figures["search/winner_macro_f1"] == 0.26716
    assert figures["search/best_macro_f1"] == 0.5692
