import io

import numpy as np
import pytest
import torch

from wellfed import device as dev
from wellfed.config import ModelConfig
from wellfed.data.token_files import TokenBatch, TokenFile, write_token_file
from wellfed.evaluate.predictions import predict, predictions_frame
from wellfed.evaluate.scores import score
from wellfed.model import load_model


def test_predictions_come_back_in_file_order(tmp_path, tiny_model_dir):
    rng = np.random.default_rng(0)
    rows = [rng.integers(1000, 3000, size=rng.integers(3, 30), dtype=np.int32) for _ in range(57)]
    path = tmp_path / "test.arrow"
    write_token_file(path, [TokenBatch(np.concatenate(rows), np.array([len(r) for r in rows], np.int32),
                                       np.arange(57) % 2, np.arange(57) * 10)])
    data = TokenFile(path)
    torch.manual_seed(0)
    model = load_model(ModelConfig(init="random"), str(tiny_model_dir), ["neg", "pos"]).eval()
    cpu = torch.device("cpu")
    probs = predict(model, data, 0, cpu, dev.choose_precision("auto", cpu), batch_rows=8)
    with torch.no_grad():  # one row at a time, no padding, no sorting: the reference
        ref = np.stack([torch.softmax(model(input_ids=torch.tensor(r[None], dtype=torch.long))
                                      .logits, -1)[0].numpy() for r in rows])
    np.testing.assert_allclose(probs, ref, atol=1e-5)
    frame = predictions_frame(data, probs, ["neg", "pos"])
    assert frame["row_id"].tolist() == list(range(0, 570, 10))
    assert list(frame.columns) == ["row_id", "gold", "predicted", "prob_neg", "prob_pos"]


def test_score_reports_per_class_and_macro_f1():
    gold = np.array([0, 0, 1, 1, 2])
    probs = np.eye(3)[[0, 1, 1, 1, 2]]
    out = score(gold, probs, ["a", "b", "c"])
    assert out["accuracy"] == 0.8 and out["rows"] == 5
    assert out["per_class"]["a"] == {"label": "a", "precision": 1.0, "recall": 0.5, "f1": 2 / 3,
                                     "support": 2}
    assert abs(out["macro_f1"] - np.mean([2 / 3, 0.8, 1.0])) < 1e-9


def test_the_scores_are_scikit_learns_figures_to_the_digit():
    """scores.py counts accuracy and F1 with numpy (importing scikit-learn costs the evaluate
    stage ~0.7 s): on random and degenerate predictions they are scikit-learn's, with its
    zero_division=0 (a class never predicted or never seen scores 0, not NaN)."""
    import pandas as pd
    from sklearn.metrics import (accuracy_score, confusion_matrix, f1_score,
                                 precision_recall_fscore_support)

    from wellfed.evaluate.scores import confusion, score_multi_label, tune_threshold

    rng = np.random.default_rng(3)
    names = ["a", "b", "c", "d"]
    cases = [(rng.integers(0, 4, 200), rng.random((200, 4))),
             (np.zeros(30, int), rng.random((30, 4))),  # one gold class: d never seen
             (rng.integers(0, 4, 50), np.tile([1.0, 0, 0, 0], (50, 1)))]  # only a predicted
    for gold, probs in cases:
        got, pred = score(gold, probs, names), probs.argmax(1)
        p, r, f, s = precision_recall_fscore_support(gold, pred, labels=range(4), zero_division=0)
        assert got["accuracy"] == accuracy_score(gold, pred)
        assert got["macro_f1"] == pytest.approx(f1_score(gold, pred, labels=range(4),
                                                         average="macro", zero_division=0))
        for i, key in enumerate(names):
            assert [got["per_class"][key][k] for k in ("precision", "recall", "f1", "support")] \
                == pytest.approx([p[i], r[i], f[i], s[i]])
    gold = (rng.random((120, 5)) < 0.3).astype(np.float32)
    gold[:, 4] = 0  # a label no row has
    probs = rng.random((120, 5))
    got, pred = score_multi_label(gold, probs, list("vwxyz"), 0.6), (probs >= 0.6).astype(int)
    for avg in ("micro", "macro"):
        assert got[f"{avg}_f1"] == pytest.approx(f1_score(gold.astype(int), pred, average=avg,
                                                          zero_division=0))
    assert got["subset_accuracy"] == accuracy_score(gold.astype(int), pred)
    best, f1 = tune_threshold(gold, probs)
    assert f1 == pytest.approx(max(f1_score(gold.astype(int), (probs >= t).astype(int),
                                            average="macro", zero_division=0)
                                   for t in np.round(np.arange(0.05, 0.951, 0.05), 2)))
    pairs = pd.DataFrame({"gold": ["x", "y", "y", "(none)", "z"],
                          "predicted": ["x", "x", "y", "y", "q"]})  # q: not a label, not counted
    labels = ["x", "y", "z", "(none)"]
    np.testing.assert_array_equal(confusion(pairs, labels), confusion_matrix(
        pairs["gold"], pairs["predicted"], labels=labels))


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_bar_names_the_pass_on_a_terminal_and_leaves_no_trace_in_a_log(
        tmp_path, tiny_model_dir, monkeypatch):
    rows = np.random.default_rng(1).integers(1000, 3000, size=(40, 6), dtype=np.int32)
    path = tmp_path / "validation.arrow"
    write_token_file(path, [TokenBatch(rows.ravel(), np.full(40, 6, np.int32), np.arange(40) % 2,
                                       np.arange(40))])
    model = load_model(ModelConfig(init="random"), str(tiny_model_dir), ["neg", "pos"])
    cpu = torch.device("cpu")
    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr("sys.stderr", stream)
        predict(model, TokenFile(path), 0, cpu, dev.choose_precision("auto", cpu), batch_rows=8,
                desc="calibration: validation logits")
        written = stream.getvalue()
        assert ("calibration: validation logits" in written) is shown, written
        assert "predict" not in written
        if shown:  # the line is blanked when done: the stage's own line follows on a clean one
            assert written.endswith("\r") and written.split("\r")[-2].strip() == "", written
