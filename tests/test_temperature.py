"""Temperature scaling (wellfed.evaluate.temperature): fitted on validation logits, folded into the exported
model's head, so evaluate, the predictor, the served MLflow model and `pipeline()` give the same
calibrated scores."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import own_wellfed
from wellfed import device as dev
from wellfed import tasks
from wellfed.config import load_section
from wellfed.data.token_files import TokenBatch, TokenFile, write_token_file
from wellfed.evaluate import predictions, scores, temperature
from wellfed.use import logged_model, serving

CPU, FP32 = torch.device("cpu"), dev.Precision("fp32", "test")
SCALE = 4.0  # the planted head's factor: logits with an sd of ~8, scores near 1
WORDS = ("good bad film plot actor slow funny dull score cast script long short warm cold "
         "fine awful great boring lovely").split()


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_a_planted_over_confident_fit_finds_its_temperature_and_keeps_every_class():
    # Labels drawn from softmax(z); the model reports 4z: calibrated at T = 4 exactly.
    rng = np.random.default_rng(0)
    z = rng.normal(size=(4000, 5)) * 1.5
    gold = np.array([rng.choice(5, p=p) for p in softmax(z)])
    fitted = temperature.fit("single_label", 4 * z, gold)
    assert fitted.temperatures.shape == (1,) and 3.6 < fitted.temperatures[0] < 4.4
    assert fitted.ece_before > 0.2 and fitted.ece_after < 0.03 and fitted.changed == 0
    under = temperature.fit("single_label", z / 3, gold)  # under-confident: T < 1
    assert 0.28 < under.temperatures[0] < 0.38 and under.ece_after < under.ece_before


def test_multi_label_fits_a_temperature_per_label_when_it_measures_better():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(3000, 3)) * 2
    gold = (rng.random(z.shape) < 1 / (1 + np.exp(-z))).astype(np.float32)
    fitted = temperature.fit("multi_label", z * np.array([1.0, 3.0, 6.0]), gold)
    np.testing.assert_allclose(fitted.temperatures, [1.0, 3.0, 6.0], rtol=0.15)
    assert fitted.ece_after < fitted.ece_before and fitted.changed == 0  # at 0.5: the sign of z
    none = gold.copy()
    none[:, 2] = 0  # a label validation never holds: fitted alone, its T runs to 20 (scores 0.5)
    scaled = z * np.array([1.0, 3.0, 6.0])
    guarded = temperature.fit("multi_label", scaled, none).temperatures
    shared = temperature.nll_fit("multi_label", scaled, none, 1)[0]
    assert temperature.nll_fit("multi_label", scaled, none, 3)[2] == temperature.BOUNDS[1]
    assert guarded[-1] == shared


def test_a_tuned_multi_label_threshold_moves_with_one_shared_temperature_and_no_decision_changes():
    # Over-confident per label, decided at 0.8 (a tuned threshold): per-label temperatures would
    # move each label's boundary differently, so one shared T is fitted and the threshold moves
    # with it to sigmoid(logit(0.8) / T), which makes exactly the decisions 0.8 made before.
    rng = np.random.default_rng(2)
    z = rng.normal(size=(3000, 3)) * 2
    gold = (rng.random(z.shape) < 1 / (1 + np.exp(-z))).astype(np.float32)
    scaled = z * np.array([1.0, 3.0, 6.0])
    fitted = temperature.fit("multi_label", scaled, gold, threshold=0.8)
    assert fitted.temperatures.shape == (1,) and fitted.temperatures[0] > 1
    t = fitted.temperatures[0]
    assert fitted.threshold == pytest.approx(1 / (1 + np.exp(-np.log(4) / t)))
    assert 0.5 < fitted.threshold < 0.8 and fitted.changed == 0
    assert fitted.ece_after < fitted.ece_before
    before = 1 / (1 + np.exp(-scaled)) >= 0.8
    after = 1 / (1 + np.exp(-scaled / t)) >= fitted.threshold
    assert (before == after).all()
    assert temperature.moved(0.5, t) == 0.5 and temperature.moved(0.3, 1.0) == pytest.approx(0.3)


@pytest.mark.parametrize("mode, before, after, changed, applied, says", [
    ("auto", 0.10, 0.02, 0, True, "lowers validation ECE"),
    ("auto", 0.02, 0.03, 0, False, "only when it lowers validation ECE"),
    ("auto", 0.10, 0.02, 2, False, "would change 2 prediction(s)"),
    ("temperature", 0.02, 0.03, 0, True, "train.calibrate: temperature")])
def test_auto_applies_it_only_when_it_helps_and_changes_no_prediction(mode, before, after, changed,
                                                                     applied, says):
    fitted = temperature.Fit(np.array([1.5]), before, after, changed)
    apply, why = temperature.decide(mode, fitted)
    assert apply is applied and says in why


BARELY = np.random.default_rng(0)
LABELS_100 = BARELY.integers(0, 3, 100)


@pytest.mark.parametrize("logits, says", [
    # A barely trained model: logits ~0.01 apart, the arg-max right on half the rows.
    (BARELY.normal(size=(100, 3)) * 0.01 + 0.004 * np.eye(3)[LABELS_100],
     "the fit ran to its bound T = 0.05: the model's scores are nearly flat (median logit spread "
     "0.016) while its arg-max is right on 52% of the validation rows: a barely trained model"),
    # Untrained: a constant lean to one class, as a fresh head's bias gives.
    (np.tile([0.02, -0.01, 0.0], (100, 1)) + BARELY.normal(size=(100, 3)) * 0.001,
     "the fit ran to its bound T = 20: flatter scores always fit the validation labels better, "
     "so the model's scores say next to nothing about them (arg-max right on 29% of the rows, "
     "33% by chance): a model that has not learned the task (yet)"),
    # Every row right: sharper is always better.
    (0.001 * np.eye(3)[LABELS_100] + BARELY.normal(size=(100, 3)) * 1e-5,
     "the fit ran to its bound T = 0.05: every validation row is already right")])
def test_a_fit_at_its_bound_is_refused_and_says_what_the_model_did(logits, says):
    """A barely trained model's fit runs to a bound; the line said "degenerate validation data"
    when the data was fine: it says what the model's scores did instead."""
    fitted = temperature.fit("single_label", logits, LABELS_100)
    assert float(fitted.temperatures[0]) in temperature.BOUNDS
    apply, why = temperature.decide("auto", fitted)
    assert not apply and why.startswith(says) and why.endswith("(train.calibrate: auto)"), why
    assert "degenerate" not in why and "data" not in why.split(":")[1]
    assert temperature.decide("temperature", fitted)[0]  # asked for by name: done


def test_the_param_takes_three_values_and_defaults_to_auto():
    assert load_section({}, "train").calibrate == "auto"
    with pytest.raises(ValueError, match="train.calibrate must be one of auto, temperature, "
                                         "none; got 'platt'"):
        load_section({"train": {"calibrate": "platt"}}, "train")


def test_regression_and_none_do_nothing_and_say_so(tmp_path):
    regression = temperature.calibrate_model(tmp_path, None, 0, "regression", "auto")
    assert regression.record == {"method": "none", "reason": "regression: no probabilities"}
    assert "not applicable" in regression.line and regression.details == {}
    off = temperature.calibrate_model(tmp_path, None, 0, "single_label", "none")
    assert off.line == "calibration: off (train.calibrate: none)" and off.details == {}


class SquashedHead(torch.nn.Module):
    """Logits that are not a Linear's outputs: tanh after the head."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(num_labels=2)
        self.embed = torch.nn.Embedding(100, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return SimpleNamespace(logits=torch.tanh(self.head(self.embed(input_ids).mean(1))))


def test_a_head_that_cannot_hold_the_temperature_is_left_as_it_was():
    model = SquashedHead()
    weight = model.head.weight.detach().clone()
    probe = {"input_ids": np.array([[1, 2, 3]]), "attention_mask": np.ones((1, 3), np.int64)}
    why = temperature.fold(model, np.array([2.0]), probe)
    assert "cannot be folded" in why and torch.equal(model.head.weight, weight)


# ---------------------------------------------------------------- a real exported model

def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(3, 14))) for _ in range(n)]


def token_file(path: Path, tokenizer, rows: list[str], labels: np.ndarray) -> TokenFile:
    """Token ids as serving's tokenizer call makes them, so both read the same inputs."""
    ids = tokenizer(rows, truncation=True, max_length=128)["input_ids"]
    lengths = np.array([len(r) for r in ids], np.int32)
    write_token_file(path, [TokenBatch(np.concatenate(ids).astype(np.int32), lengths, labels,
                                       np.arange(len(rows)))])
    return TokenFile(path)


def exported(tiny_model_dir: Path, dest: Path, labels: list[str], problem_type: str) -> Path:
    """A tiny BERT saved as the train stage exports one, with wellfed.json, initialised wide
    (initializer_range 0.5: at the usual 0.02 every row gets the same logits to 1e-4) and its
    head scaled by SCALE (planted over-confidence)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=len(labels),
                                        id2label=dict(enumerate(labels)),
                                        label2id={n: i for i, n in enumerate(labels)},
                                        problem_type=problem_type, initializer_range=0.5)
    model = AutoModelForSequenceClassification.from_config(config)
    with torch.no_grad():
        model.classifier.weight.mul_(SCALE)
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(tiny_model_dir / name, dest / name)
    task = serving.TASKS[problem_type]
    tasks.write_model_info(dest, {"task": task, "text_columns": ["sentence"], "threshold": 0.5,
                                  "max_length": 128})
    return dest


def raw_logits(model_dir: Path, data: TokenFile, task: str) -> np.ndarray:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    return predictions.predict(model, data, 0, CPU, FP32, task=task, logits=True)


def calibrated_outputs(model_dir: Path, data: TokenFile, task: str) -> np.ndarray:
    """What the evaluate stage computes: the exported model's outputs."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    return predictions.predict(model, data, 0, CPU, FP32, task=task)


def record_with(model_dir: Path, calibrated) -> None:
    info = json.loads((model_dir / tasks.MODEL_INFO).read_text())
    tasks.write_model_info(model_dir, {**info, "calibration": calibrated.record})


@pytest.fixture(scope="module")
def single(tiny_model_dir, tokenizer, tmp_path_factory):
    """A planted over-confident single-label model: gold is its own arg-max on 70% of 400
    validation rows and another class on the rest, its scores near 1."""
    root = tmp_path_factory.mktemp("calibrate")
    model_dir = exported(tiny_model_dir, root / "model", ["neg", "neu", "pos"],
                         "single_label_classification")
    rows = texts(400, 0)
    blank = token_file(root / "blank.arrow", tokenizer, rows, np.zeros(400, np.int64))
    logits = raw_logits(model_dir, blank, "single_label")
    rng = np.random.default_rng(0)
    gold = np.where(rng.random(400) < 0.7, logits.argmax(1), (logits.argmax(1) + 1) % 3)
    val = token_file(root / "validation.arrow", tokenizer, rows, gold.astype(np.int64))
    before = tasks.outputs("single_label", torch.as_tensor(logits)).numpy()
    calibrated = temperature.calibrate_model(model_dir, val, 0, "single_label", "auto")
    record_with(model_dir, calibrated)
    return SimpleNamespace(model_dir=model_dir, val=val, rows=rows, before=before,
                           calibrated=calibrated)


def test_calibration_lowers_validation_ece_and_leaves_every_class_unchanged(single):
    record = single.calibrated.record
    assert record["method"] == "temperature" and record["temperatures"][0] > 2
    assert record["val_ece_after"] < record["val_ece_before"] / 2 and record["val_ece_before"] > 0.2
    assert record["changed_predictions"] == 0
    after = calibrated_outputs(single.model_dir, single.val, "single_label")  # the saved model
    assert (after.argmax(1) == single.before.argmax(1)).all() and len(after) == 400
    gold = single.val.labels
    assert scores.calibration("single_label", gold, after)["ece"] == pytest.approx(
        record["val_ece_after"], abs=1e-4)
    assert scores.calibration("single_label", gold, single.before)["ece"] == pytest.approx(
        record["val_ece_before"], abs=1e-4)
    np.testing.assert_allclose(temperature.uncalibrated("single_label", after, record),
                               single.before, atol=1e-4)
    line = single.calibrated.line
    assert line.startswith("calibration: temperature ")
    assert "no predictions changed; applied" in line
    assert single.calibrated.details == {"calibration": (
        f"temperature {record['temperatures'][0]:.3g} applied; ECE on validation "
        f"{record['val_ece_before']:.4f} -> {record['val_ece_after']:.4f}")}


@pytest.mark.integration
def test_the_predictor_pipeline_and_served_model_give_evaluates_scores(single, tmp_path):
    import mlflow
    from transformers import pipeline

    from wellfed.track import tracking

    evaluated = calibrated_outputs(single.model_dir, single.val, "single_label")
    frame = pd.DataFrame({"sentence": single.rows})
    predictor = serving.load(single.model_dir, CPU)
    direct = serving.predict(predictor, frame)[["prob_neg", "prob_neu", "prob_pos"]].to_numpy()
    np.testing.assert_allclose(direct, evaluated, atol=1e-5)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "calibrated", "r")
    info, _ = logged_model.log_model(uri, run_id, single.model_dir, "calibrated-classifier")
    mlflow.set_tracking_uri(uri)
    with own_wellfed():
        served = mlflow.pyfunc.load_model(info.model_uri).predict(frame)
    np.testing.assert_allclose(served[["prob_neg", "prob_neu", "prob_pos"]].to_numpy(), evaluated,
                               atol=1e-5)
    named = np.array(["neg", "neu", "pos"])[evaluated.argmax(1)]
    assert (served["label"].to_numpy() == named).all()

    classify = pipeline("text-classification", model=str(single.model_dir), device=-1, top_k=None)
    for text, scores, row in zip(single.rows[:20], classify(single.rows[:20]), evaluated[:20]):
        got = {s["label"]: s["score"] for s in scores}
        np.testing.assert_allclose([got["neg"], got["neu"], got["pos"]], row, atol=1e-5,
                                   err_msg=text)


def test_the_exported_model_folder_is_whole_after_calibration(single):
    names = sorted(p.name for p in single.model_dir.iterdir())
    assert names == ["config.json", "model.safetensors", "special_tokens_map.json",
                     "tokenizer.json", "tokenizer_config.json", "vocab.txt", "wellfed.json"]
    assert not [p for p in single.model_dir.parent.iterdir() if p.name.startswith(".")]
    modes = {p.name: p.stat().st_mode for p in single.model_dir.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"]


def test_a_planted_over_confident_multi_label_model_is_calibrated_per_decision(
        tiny_model_dir, tokenizer, tmp_path):
    model_dir = exported(tiny_model_dir, tmp_path / "model", ["a", "b", "c", "d"],
                         "multi_label_classification")
    rows = texts(400, 1)
    blank = token_file(tmp_path / "blank.arrow", tokenizer, rows, np.zeros((400, 4), np.float32))
    logits = raw_logits(model_dir, blank, "multi_label")
    rng = np.random.default_rng(1)
    said = logits > 0
    gold = np.where(rng.random(said.shape) < 0.75, said, ~said).astype(np.float32)
    val = token_file(tmp_path / "validation.arrow", tokenizer, rows, gold)
    calibrated = temperature.calibrate_model(model_dir, val, 0, "multi_label", "auto", 0.5)
    record = calibrated.record
    assert record["method"] == "temperature" and min(record["temperatures"]) > 1
    assert record["val_ece_after"] < record["val_ece_before"] and record["changed_predictions"] == 0
    after = calibrated_outputs(model_dir, val, "multi_label")
    assert ((after >= 0.5) == said).all()
    np.testing.assert_allclose(temperature.uncalibrated("multi_label", after, record),
                               tasks.outputs("multi_label", torch.as_tensor(logits)).numpy(),
                               atol=1e-4)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "roberta"])
def test_the_temperature_folds_into_decoder_and_roberta_heads(arch):
    # GPT-2's and Llama's `score` has no bias; RoBERTa's logits come from classifier.out_proj.
    from transformers import (
        AutoModelForSequenceClassification,
        GPT2Config,
        LlamaConfig,
        RobertaConfig,
    )

    small = {"vocab_size": 120, "num_labels": 2, "pad_token_id": 0}
    config = {"gpt2": lambda: GPT2Config(n_embd=16, n_layer=1, n_head=2, **small),
              "llama": lambda: LlamaConfig(hidden_size=16, intermediate_size=32,
                                           num_hidden_layers=1, num_attention_heads=2,
                                           num_key_value_heads=1, **small),
              "roberta": lambda: RobertaConfig(hidden_size=16, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=32,
                                               max_position_embeddings=40, **small)}[arch]()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    ids = np.array([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    probe = {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)}
    batch = dev.to_device(probe, CPU)
    with torch.no_grad():
        before = dev.forward(model, batch, probe)
    assert temperature.fold(model, np.array([1.5, 3.0]), probe) is None
    with torch.no_grad():
        after = dev.forward(model, batch, probe)
    torch.testing.assert_close(after, before / torch.tensor([1.5, 3.0]), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["auto", "temperature"])
def test_a_one_class_validation_split_is_not_fitted_on(single, tokenizer, tmp_path, mode):
    """data/coverage.py: one class says nothing of the others; the model is left as it was."""
    val = token_file(tmp_path / "validation.arrow", tokenizer, single.rows[:60],
                     np.full(60, 2, np.int64))
    weights = (single.model_dir / "model.safetensors").read_bytes()
    calibrated = temperature.calibrate_model(single.model_dir, val, 0, "single_label", mode)
    assert calibrated.record == {"method": "none", "reason": "validation has one class (pos: 60 "
                                                             "rows)"}
    assert calibrated.line == (("WARNING: " if mode == "temperature" else "") +
                               "calibration: not applied (validation has one class (pos: 60 "
                               "rows): a temperature fitted there says nothing of the others)")
    assert calibrated.details == {"calibration": "not applied: validation has one class (pos: 60 "
                                              "rows): a temperature fitted there says nothing of "
                                              "the others"}
    assert (single.model_dir / "model.safetensors").read_bytes() == weights
