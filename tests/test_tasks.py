"""The task shapes: inferred from the labels, prepared, tokenized (pairs keep their segments),
trained in-process with the task's loss, validated with exact figures across ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from scipy.stats import pearsonr
from sklearn.metrics import accuracy_score, f1_score

from tests.conftest import PROJECT
from wellfed import tasks
from wellfed.config import DataConfig, ModelConfig, TrainConfig
from wellfed.data.token_files import TokenFile
from wellfed.train.step.loop import Place, TrainJob, train

COLORS = ["red", "green", "blue", "amber"]


def stage(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PROJECT / "stages" / script), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


def prepare(tmp_path: Path, files: dict[str, str], params: dict) -> subprocess.CompletedProcess:
    raw = tmp_path / "raw"
    raw.mkdir(exist_ok=True)
    for name, text in files.items():
        (raw / name).write_text(text, encoding="utf-8")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"prepare": params, **PARAMS_EXTRA}))
    return stage(tmp_path, "prepare.py", "raw", "prepared", "prepare.json")


PARAMS_EXTRA: dict = {}


def report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "prepare.json").read_text())


# ----------------------------------------------------------------- figures across ranks

def two_ranks(task: str, logits: torch.Tensor, labels: torch.Tensor, k: int) -> dict:
    """Validation figures from two halves summed, as two ranks' all-reduce gives them."""
    half = len(logits) // 2
    sums = (tasks.val_stats(task, logits[:half], labels[:half])
            + tasks.val_stats(task, logits[half:], labels[half:]))
    return tasks.val_metrics(task, sums.tolist(), k)


def test_validation_sums_give_sklearn_and_scipy_figures_across_two_ranks():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(101, 4, generator=gen)
    gold = torch.randint(0, 4, (101,), generator=gen)
    got = two_ranks("single_label", logits, gold, 4)
    pred = logits.argmax(-1).numpy()
    assert got["val/accuracy"] == pytest.approx(accuracy_score(gold, pred))
    assert got["val/macro_f1"] == pytest.approx(f1_score(gold, pred, average="macro",
                                                         labels=range(4), zero_division=0))
    multi = (torch.rand(101, 4, generator=gen) > 0.6).float()
    got = two_ranks("multi_label", logits, multi, 4)
    pred = (torch.sigmoid(logits) >= 0.5).int().numpy()
    assert got["val/micro_f1"] == pytest.approx(f1_score(multi.int(), pred, average="micro"))
    assert got["val/macro_f1"] == pytest.approx(f1_score(multi.int(), pred, average="macro",
                                                         zero_division=0))
    assert got["val/subset_accuracy"] == pytest.approx(accuracy_score(multi.int(), pred))
    values = torch.randn(101, 2, generator=gen)
    target = values + 0.8 * torch.randn(101, 2, generator=gen)
    got = two_ranks("regression", values, target, 2)
    # In float64: scipy computes in its inputs' dtype, and float32 differs by ~1e-7.
    expected = np.mean([pearsonr(values[:, i].double(), target[:, i].double())[0]
                        for i in range(2)])
    assert got["val/pearson"] == pytest.approx(expected, abs=1e-9)
    assert got["val/mse"] == pytest.approx(float(((values - target) ** 2).mean()))


def test_class_weights_balanced_keep_the_mean_row_weight_at_one_and_names_are_checked():
    labels = np.array([0] * 90 + [1] * 10)
    weights = tasks.loss_weights("single_label", "balanced", labels, ["a", "b"])
    assert weights.tolist() == pytest.approx([100 / 180, 100 / 20])
    assert float(weights[labels].mean()) == pytest.approx(1.0)
    multi = np.array([[1, 0]] * 3 + [[1, 1]], np.float32)
    assert tasks.loss_weights("multi_label", "balanced", multi, ["x", "y"]).tolist() == [0.0, 3.0]
    assert tasks.loss_weights("single_label", {"b": 4}, labels, ["a", "b"]).tolist() == [1.0, 4.0]
    with pytest.raises(ValueError, match=r"train.class_weights names 'c', which is not a label"):
        tasks.loss_weights("single_label", {"c": 2}, labels, ["a", "b"])
    with pytest.raises(ValueError, match="a regression task takes none"):
        tasks.loss_weights("regression", "balanced", np.zeros((3, 1)), ["y"])
    # In the loss: a weighted row counts that many times.
    logits, gold = torch.zeros(2, 2), torch.tensor([0, 1])
    rows = tasks.row_loss("single_label", logits, gold, torch.tensor([1.0, 3.0]))
    assert rows.tolist() == pytest.approx([np.log(2), 3 * np.log(2)])


# ----------------------------------------------------------------- task inference in prepare

def multi_label_tsv(n: int, seed: int) -> str:
    """GoEmotions' shape: no header, text, comma-separated label ids, an id column."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        held = sorted(set(rng.choice(4, size=rng.integers(1, 3)).tolist()))
        words = [COLORS[j] for j in held] + ["word"] * int(rng.integers(1, 6))
        rng.shuffle(words)
        lines.append(f"{' '.join(words)} {i}\t{','.join(map(str, held))}\tid{i}\n")
    return "".join(lines)


def test_delimited_label_ids_whose_parts_occur_alone_are_multi_label(tmp_path):
    proc = prepare(tmp_path, {"train.tsv": multi_label_tsv(120, 0)},
                   {"validation": "", "test": "", "header": False, "text_column": 0,
                    "label_column": 1})
    assert proc.returncode == 0, proc.stderr
    rep = report(tmp_path)
    assert rep["task"] == "multi_label" and "','-separated labels that also occur alone" in \
        rep["task_reason"]
    assert [line for line in proc.stdout.splitlines()
            if line.startswith("[wellfed] prepare: task ")][0].startswith(
        "[wellfed] prepare: task multi_label (")
    labels = json.loads((tmp_path / "prepared" / "labels.json").read_text())
    assert labels["names"] == ["0", "1", "2", "3"] and labels["task"] == "multi_label"
    train = pd.read_parquet(tmp_path / "prepared" / "train.parquet")
    hot = np.stack(train["label"].to_numpy())
    assert hot.shape[1] == 4 and set(np.unique(hot)) == {0.0, 1.0} and hot.sum(1).min() >= 1
    assert "carved from train" in rep["splits"]["validation"]["read_as"] and "at random" in \
        rep["splits"]["validation"]["read_as"]


def test_class_names_with_the_delimiter_stay_single_label(tmp_path):
    rows = "".join(f"item {i}\t{['$5, $10', '$10, $20', 'free'][i % 3]}\n" for i in range(60))
    proc = prepare(tmp_path, {"train.tsv": "sentence\tlabel\n" + rows},
                   {"validation": "", "test": ""})
    assert proc.returncode == 0, proc.stderr
    assert report(tmp_path)["task"] == "single_label"
    assert json.loads((tmp_path / "prepared" / "labels.json").read_text())["names"] == [
        "$10, $20", "$5, $10", "free"]


@pytest.mark.integration
def test_numbers_that_are_not_whole_are_regression_and_a_word_among_them_is_one_line(tmp_path):
    rows = "".join(f"text {i}\t{2 + (i % 7) / 4}\n" for i in range(50))
    proc = prepare(tmp_path, {"train.tsv": "sentence\tscore\n" + rows},
                   {"validation": "", "test": "", "label_column": "score"})
    assert proc.returncode == 0, proc.stderr
    rep = report(tmp_path)
    assert rep["task"] == "regression" and rep["num_labels"] == 1
    assert "targets: score mean" in proc.stdout
    bad = rows + "text x\thigh\n"
    proc = prepare(tmp_path, {"train.tsv": "sentence\tscore\n" + bad},
                   {"validation": "", "test": "", "label_column": "score", "task": "regression"})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: raw/train.tsv: data row 51 has the label 'high', not a number (1 such row); a "
        "regression needs numeric labels: fix them, or set prepare.task"]


def test_a_list_label_in_a_single_label_task_is_one_line(tmp_path):
    rows = [{"sentence": f"s {i}", "label": ["a", "b"] if i == 3 else "a" if i % 2 else "b"}
            for i in range(20)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    proc = prepare(tmp_path, {"train.jsonl": text},
                   {"train": "train.jsonl", "validation": "", "test": "", "task": "single_label"})
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "error: raw/train.jsonl: data row 4 has a list of labels, but the task is single_label; "
        "set prepare.task: multi_label (or fix the label column)")


# ----------------------------------------------------------------- every task, in-process

def pair_tsv(n: int, seed: int) -> str:
    """Label `same` iff both sentences name the same colour: needs both halves of the pair."""
    rng = np.random.default_rng(seed)
    lines = ["premise\thypothesis\tlabel\n"]
    for i in range(n):
        a, b = rng.choice(COLORS), rng.choice(COLORS)
        lines.append(f"the {a} one {i}\tit is {b} word {'word ' * int(rng.integers(0, 5))}\t"
                     f"{'same' if a == b else 'other'}\n")
    return "".join(lines)


def regression_tsv(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    lines = ["sentence\tscore\n"]
    for i in range(n):
        good = int(rng.integers(0, 4))
        words = ["good"] * good + ["word"] * int(rng.integers(1, 5))
        rng.shuffle(words)
        lines.append(f"{' '.join(words)} {i}\t{1 + good + 0.25 * rng.random():.3f}\n")
    return "".join(lines)


CASES = {
    "pairs": ({"train.tsv": pair_tsv(240, 0)},
              {"text_column": ["premise", "hypothesis"]}, "val/accuracy"),
    "multi_label": ({"train.tsv": multi_label_tsv(240, 1)},
                    {"header": False, "text_column": 0, "label_column": 1}, "val/micro_f1"),
    "regression": ({"train.tsv": regression_tsv(240, 2)},
                   {"label_column": "score"}, "val/pearson"),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_task_prepares_tokenizes_and_trains_in_process(case, tmp_path, tiny_model_dir):
    files, params, figure = CASES[case]
    PARAMS_EXTRA["model"] = {"name": str(tiny_model_dir)}
    try:
        proc = prepare(tmp_path, files, {"validation": "", "test": "", "val_fraction": 0.2, **params})
    finally:
        PARAMS_EXTRA.clear()
    assert proc.returncode == 0, proc.stderr
    proc = stage(tmp_path, "tokenize_text.py", "prepared", "tokens", "tokens.json")
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "tokens" / "meta.json").read_text())
    data = TokenFile(tmp_path / "tokens" / "train.arrow")
    batch = data.gather(np.arange(4), meta["pad_id"])
    if case == "pairs":  # token types rebuilt from where the second segment starts
        assert data.segments is not None and "token_type_ids" in batch
        for row, types in zip(range(4), batch["token_type_ids"]):
            ids = data.row(row)
            first_sep = int(np.flatnonzero(ids == 102)[0])  # [CLS] a [SEP] b [SEP]
            assert types[:first_sep + 1].sum() == 0 and types[first_sep + 1:len(ids)].all()
            assert not types[len(ids):].any()
    else:
        assert data.segments is None and "token_type_ids" not in batch
    cfg = TrainConfig(epochs=4, lr=3e-3, global_batch_size=16, micro_batch_size=8, eval_every=0,
                      report_every=4, checkpoint_every=0, precision="fp32", seed=0,
                      warmup_ratio=0.0)
    job = TrainJob(train=cfg, data=DataConfig(), model=ModelConfig(init="random"),
                   tokens_dir=tmp_path / "tokens", model_source=str(tiny_model_dir),
                   labels=tuple(meta["labels"]), pad_id=meta["pad_id"], task=meta["task"])
    reports = []
    state = train(job, Place(torch.device("cpu")), lambda m, d: reports.append(m))
    losses = [h["loss"] for h in state.history]
    assert np.isfinite(losses).all() and np.mean(losses[-4:]) < np.mean(losses[:4])
    val = reports[-1]["val"]
    assert figure in val and np.isfinite(val[figure]), val
