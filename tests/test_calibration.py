"""Expected calibration error and the reliability plot (scores.calibration)."""

import numpy as np
import pytest
from sklearn.calibration import calibration_curve

from wellfed.evaluate.plots import plot_reliability
from wellfed.evaluate.scores import HEADLINE, calibration


def test_ece_matches_a_hand_computation():
    # Top-class confidences: 4 rows at 0.95 (3 right), 4 at 0.65 (2 right), 2 at 0.55 (1 right).
    # 15 bins of width 1/15: 0.95 -> bin 14, 0.65 -> bin 9, 0.55 -> bin 8.
    top = np.array([0.95] * 4 + [0.65] * 4 + [0.55] * 2)
    probs = np.stack([top, 1 - top], 1)
    gold = np.array([0, 0, 0, 1, 0, 0, 1, 1, 0, 1])
    out = calibration("single_label", gold, probs)
    hand = 0.4 * abs(0.75 - 0.95) + 0.4 * abs(0.5 - 0.65) + 0.2 * abs(0.5 - 0.55)  # 0.15
    assert out["ece"] == pytest.approx(hand)
    table = out["calibration"]
    assert table["bins"] == 15 and sum(table["count"]) == 10
    assert [i for i, n in enumerate(table["count"]) if n] == [8, 9, 14]
    assert table["accuracy"][14] == 0.75 and table["accuracy"][0] is None


def test_bins_agree_with_sklearn_calibration_curve():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2000, 4)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    gold = rng.integers(0, 4, size=2000)
    table = calibration("single_label", gold, probs)["calibration"]
    correct = (probs.argmax(1) == gold).astype(int)
    prob_true, prob_pred = calibration_curve(correct, probs.max(1), n_bins=15, strategy="uniform")
    assert len(prob_true) == sum(a is not None for a in table["accuracy"]) > 5
    np.testing.assert_allclose([a for a in table["accuracy"] if a is not None], prob_true)
    np.testing.assert_allclose([c for c in table["mean_confidence"] if c is not None], prob_pred)


def test_multi_label_pools_every_label_probability():
    probs = np.array([[0.9, 0.1], [0.9, 0.1]])
    gold = np.array([[1, 0], [0, 0]])
    # Pooled: 0.9 twice (one positive) in bin 13, 0.1 twice (none positive) in bin 1.
    assert calibration("multi_label", gold, probs)["ece"] == pytest.approx(
        0.5 * abs(0.5 - 0.9) + 0.5 * abs(0.0 - 0.1))


def test_regression_has_no_calibration_and_classification_headlines_name_ece():
    assert calibration("regression", np.zeros((3, 1)), np.zeros((3, 1))) == {}
    assert "ece" in HEADLINE["single_label"] and "ece" in HEADLINE["multi_label"]
    assert "ece" not in HEADLINE["regression"]


def test_reliability_plot_is_written(tmp_path):
    top = np.linspace(0.5, 1.0, 50)
    out = calibration("single_label", np.zeros(50, int), np.stack([top, 1 - top], 1))
    plot_reliability(out["calibration"], out["ece"], tmp_path / "reliability.png")
    assert (tmp_path / "reliability.png").read_bytes()[:4] == b"\x89PNG"
