import numpy as np
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
