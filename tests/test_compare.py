"""wellfed.compare.significance / wellfed.compare: paired flips, McNemar, bootstrap, refusals, run lookup."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest
from sklearn.metrics import f1_score

from wellfed.compare import significance
from wellfed.compare.command import main
from wellfed.compare.prediction_sources import Scored, load
from wellfed.compare.significance import compare

LABELS = ["neg", "neu", "pos"]


def planted(rows=500, fixed=30, broke=10, seed=0):
    """A wrong on a fifth of the rows; B fixes `fixed` of them and breaks `broke` rows A had
    right."""
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 3, size=rows)
    pred_a = gold.copy()
    wrong = rng.choice(rows, size=rows // 5, replace=False)
    pred_a[wrong] = (gold[wrong] + 1) % 3
    pred_b = pred_a.copy()
    pred_b[wrong[:fixed]] = gold[wrong[:fixed]]
    right = np.setdiff1d(np.arange(rows), wrong)[:broke]
    pred_b[right] = (gold[right] + 2) % 3
    ids = np.arange(rows) * 7 + 3  # row ids are not positions
    return ids, gold, pred_a, pred_b, wrong[:fixed], right


def scored(ref, ids, gold, pred, split="test", task="single_label"):
    names = np.array(LABELS, object)
    frame = pd.DataFrame({"row_id": ids, "gold": names[gold], "predicted": names[pred]})
    report = {"task": task, "split": split,
              "per_class": {k: {"label": k} for k in LABELS}}
    return Scored(ref, f"planted {ref}", frame, report)


def test_planted_fixes_and_breaks_are_counted_tested_and_bounded():
    ids, gold, pred_a, pred_b, fixed, broke = planted()
    out = compare(scored("A", ids, gold, pred_a), scored("B", ids, gold, pred_b))
    flips = out["flips"]
    assert (flips["wrong_to_right"], flips["right_to_wrong"]) == (30, 10)
    assert flips["both_right"] + flips["both_wrong"] == 460
    assert set(flips["wrong_to_right_rows"]) <= set(ids[fixed]) and \
        len(flips["wrong_to_right_rows"]) == 10
    assert set(flips["right_to_wrong_rows"]) == set(ids[broke])
    assert out["mcnemar_p"] == pytest.approx(binomtest(10, 40, 0.5).pvalue)
    accuracy = out["accuracy"]
    assert accuracy["diff"] == pytest.approx(20 / 500)
    low, high = accuracy["ci95"]
    assert 0 < low < 20 / 500 < high  # contains the true +4 pt, excludes 0
    assert out["verdict"].startswith("B - A macro-F1 (the headline) +4.0 pt, 95% CI [+") and \
        out["verdict"].endswith(": B is better") and out["verdict_metric"] == "macro_f1"
    f1 = out["macro_f1"]  # the point figures are sklearn's, over all three classes
    assert f1["a"] == pytest.approx(f1_score(gold, pred_a, labels=[0, 1, 2], average="macro"))
    assert f1["b"] == pytest.approx(f1_score(gold, pred_b, labels=[0, 1, 2], average="macro"))
    assert f1["ci95"][0] < f1["diff"] < f1["ci95"][1]


def test_the_bootstrap_is_seeded_and_chunked_the_same():
    ids, gold, pred_a, pred_b, _, _ = planted()
    first = significance.bootstrap(gold, pred_a, pred_b, 3, resamples=2000, seed=1)
    again = significance.bootstrap(gold, pred_a, pred_b, 3, resamples=2000, seed=1)
    np.testing.assert_array_equal(first["accuracy"], again["accuracy"])
    assert len(first["accuracy"]) == len(first["macro_f1"]) == 2000
    # Each resample's difference is a difference of draws-weighted counts: a multiple of 1/500.
    assert np.allclose(first["accuracy"] * 500, np.round(first["accuracy"] * 500))


def test_identical_runs_are_within_noise_with_p_one():
    ids, gold, pred_a, _, _, _ = planted()
    out = compare(scored("A", ids, gold, pred_a), scored("B", ids, gold, pred_a))
    assert out["accuracy"]["ci95"] == [0.0, 0.0] and out["macro_f1"]["ci95"] == [0.0, 0.0]
    assert out["mcnemar_p"] == 1.0
    assert out["verdict"] == ("B - A macro-F1 (the headline) +0.0 pt, 95% CI [+0.0, +0.0]: "
                              "within noise")


def test_the_verdict_is_on_the_headline_when_accuracy_hides_a_class_lost():
    """The issue's case: B keeps accuracy but stops predicting a rare class; macro-F1 (what the
    champion and the search rank on) drops far outside noise, and the verdict says so."""
    rng = np.random.default_rng(0)
    gold = np.where(rng.random(1000) < 0.06, 1, rng.integers(0, 2, 1000) * 2)  # 6% "neu"
    ids = np.arange(1000)
    pred_a = gold.copy()
    flip = rng.choice(1000, 60, replace=False)
    pred_a[flip] = (gold[flip] + 2) % 4 % 3  # 6% wrong
    pred_b = pred_a.copy()
    pred_b[flip[:45]] = gold[flip[:45]]  # B fixes most of A's mistakes...
    pred_b[pred_b == 1] = 0  # ...but never says "neu": accuracy -0.2 pt, macro-F1 -29 pt
    out = compare(scored("A", ids, gold, pred_a), scored("B", ids, gold, pred_b))
    low, high = out["accuracy"]["ci95"]
    assert low <= 0 <= high  # accuracy alone would call it within noise
    assert out["macro_f1"]["ci95"][1] < -0.1
    assert out["verdict"].startswith("B - A macro-F1 (the headline) -") and \
        out["verdict"].endswith(": B is worse"), out["verdict"]


def test_rows_in_another_order_are_matched_by_row_id():
    ids, gold, pred_a, pred_b, _, _ = planted()
    order = np.random.default_rng(1).permutation(len(ids))
    shuffled = compare(scored("A", ids, gold, pred_a),
                       scored("B", ids[order], gold[order], pred_b[order]))
    assert (shuffled["flips"]["wrong_to_right"], shuffled["flips"]["right_to_wrong"]) == (30, 10)


@pytest.mark.parametrize("change, words", [
    ("rows", "A and B scored different rows (A 500, B 500, 499 shared)"),
    ("split", "A scored the test split and B the validation split"),
    ("gold", "A and B give different gold labels for 1 rows"),
    ("task", "compare is not supported yet for multi_label"),
])
def test_runs_that_scored_different_things_are_refused_in_one_line(change, words):
    ids, gold, pred_a, pred_b, _, _ = planted()
    ids_b, gold_b, split, task = ids.copy(), gold.copy(), "test", "single_label"
    if change == "rows":
        ids_b[0] = -1
    elif change == "split":
        split = "validation"
    elif change == "gold":
        gold_b[5] = (gold_b[5] + 1) % 3
    else:
        task = "multi_label"
    with pytest.raises(ValueError) as err:
        compare(scored("A", ids, gold, pred_a), scored("B", ids_b, gold_b, pred_b, split, task))
    assert words in str(err.value) and "\n" not in str(err.value)


def write_eval(folder, ids, gold, pred):
    run = scored("x", ids, gold, pred)
    folder.mkdir(parents=True)
    run.frame.to_parquet(folder / "predictions.parquet", index=False)
    (folder / "report.json").write_text(json.dumps(run.report))
    return folder


@pytest.mark.integration
def test_two_mlflow_run_ids_resolve_compare_and_log_to_b(tmp_path, capsys):
    import mlflow

    ids, gold, pred_a, pred_b, _, _ = planted()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("compare", artifact_location=str(tmp_path / "artifacts"))
    runs = []
    for name, pred in (("a", pred_a), ("b", pred_b)):
        run_id = client.create_run(exp, run_name=name).info.run_id
        client.log_artifacts(run_id, str(write_eval(tmp_path / name, ids, gold, pred)), "eval")
        runs.append(run_id)
    out = tmp_path / "compare.json"
    assert main([runs[0], runs[1], "--tracking-uri", uri, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "right->wrong 10, wrong->right 30" in printed and "verdict: B - A macro-F1 (the headline) +4.0 pt" \
        in printed
    result = json.loads(out.read_text())
    assert result["a"]["mlflow_run_id"] == runs[0] and result["b"]["mlflow_run_id"] == runs[1]
    assert result["split"] == "test" and result["rows"] == 500
    logged = client.get_run(runs[1]).data.metrics
    assert logged["vs/wrong_to_right"] == 30 and logged["vs/right_to_wrong"] == 10
    assert logged["vs/accuracy_diff"] == pytest.approx(0.04)
    assert len([k for k in logged if k.startswith("vs/")]) == 10
    assert all(k > "val/" for k in logged)  # after the headline in the UI's sorted lists
    artifact = json.loads(mlflow.artifacts.load_text(
        f"{client.get_run(runs[1]).info.artifact_uri}/compare/vs_{runs[0]}.json"))
    assert artifact == result
    assert not client.get_run(runs[0]).data.metrics  # A is left alone


def test_a_registry_alias_names_the_run_behind_its_version(tmp_path, capsys):
    """`models:/<name>@champion` (and `models:/<name>/<version>`) is the run that trained the
    version: the README's `wellfed-compare models:/wellfed-classifier@champion data/eval`."""
    import mlflow

    ids, gold, pred_a, pred_b, _, _ = planted()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("compare", artifact_location=str(tmp_path / "artifacts"))
    run_a = client.create_run(exp).info.run_id
    client.log_artifacts(run_a, str(write_eval(tmp_path / "a", ids, gold, pred_a)), "eval")
    client.create_registered_model("m")
    client.create_model_version("m", str(tmp_path / "model"), run_id=run_a)
    client.set_registered_model_alias("m", "champion", "1")
    b = write_eval(tmp_path / "b", ids, gold, pred_b)
    for ref in ("models:/m@champion", "models:/m/1"):
        assert main([ref, str(b), "--tracking-uri", uri]) == 0
        out = capsys.readouterr().out
        assert f"A: MLflow run {run_a} ({ref} = version 1)" in out
        assert "verdict: B - A macro-F1 (the headline) +4.0 pt" in out
    assert main(["models:/m@best", str(b), "--tracking-uri", uri]) == 1
    err = capsys.readouterr().err
    assert "no registered version models:/m@best" in err and "run `dvc repro` first" in err
    assert "dvc could not read" not in err  # a registry URI is no git revision


def test_an_unknown_run_is_one_line_naming_what_was_tried(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["0" * 32, "nope"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: '{'0' * 32}': no MLflow store at sqlite:///{tmp_path}")
    assert "dvc could not read data/eval/predictions.parquet" in err and "\n" not in err
    assert not (tmp_path / "mlflow.db").exists()  # looking did not create a store


def git(*args, cwd):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                   check=True, capture_output=True)


@pytest.mark.integration
def test_dvc_experiments_are_read_from_the_cache(tmp_path):
    """Two `dvc exp run`s of a stage writing planted predictions (a DVC-cached output): the first
    experiment's predictions are no longer in the workspace, only in the cache."""
    ids, gold, pred_a, pred_b, _, _ = planted(rows=60, fixed=6, broke=2)
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, pred in (("a", pred_a), ("b", pred_b)):
        write_eval(repo / "planted" / name, ids, gold, pred)
    (repo / "params.yaml").write_text("which: a\n")
    (repo / "dvc.yaml").write_text(
        "stages:\n  evaluate:\n"
        "    cmd: python -c \"import shutil,yaml; w=yaml.safe_load(open('params.yaml'))['which'];"
        " shutil.copytree('planted/'+w, 'data/eval', dirs_exist_ok=True)\"\n"
        "    deps: [planted]\n    params: [which]\n"
        "    outs:\n      - data/eval/predictions.parquet\n"
        "      - data/eval/report.json:\n          cache: false\n")
    git("init", "-q", cwd=repo)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], cwd=repo,
                   check=True)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "init", cwd=repo)
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-m", "dvc", "exp", "run", "-q", "-n", f"exp-{name}",
                        "-S", f"which={name}"], cwd=repo, check=True, capture_output=True)
    a = load("exp-a", f"sqlite:///{tmp_path / 'none.db'}", repo)
    b = load("exp-b", f"sqlite:///{tmp_path / 'none.db'}", repo)
    assert a.source == "data/eval/predictions.parquet at dvc revision 'exp-a'"
    assert a.run_id is None and a.report["split"] == "test"
    out = compare(a, b)
    assert (out["flips"]["wrong_to_right"], out["flips"]["right_to_wrong"]) == (6, 2)


def test_folders_compare_and_a_refusing_store_does_not_lose_the_result(tmp_path, capsys,
                                                                      monkeypatch):
    import mlflow

    from wellfed.track import tracking

    ids, gold, pred_a, pred_b, _, _ = planted()
    a = write_eval(tmp_path / "a" / "eval", ids, gold, pred_a)
    b = write_eval(tmp_path / "b" / "eval", ids, gold, pred_b)
    assert main([str(a), str(b / "predictions.parquet")]) == 0
    printed = capsys.readouterr()
    assert "verdict: B - A macro-F1 (the headline) +4.0 pt" in printed.out
    assert "not logged to MLflow: B is not an MLflow run" in printed.err

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("x", artifact_location=str(tmp_path / "artifacts"))
    run_b = client.create_run(exp).info.run_id
    client.log_artifacts(run_b, str(b), "eval")

    def refuse(*args):
        raise mlflow.exceptions.MlflowException("store is read-only")

    monkeypatch.setattr(tracking, "log_metrics", refuse)
    out = tmp_path / "out.json"
    assert main([str(a), run_b, "--tracking-uri", uri, "--out", str(out)]) == 0
    assert f"not logged to MLflow run {run_b}: store is read-only" in capsys.readouterr().err
    assert json.loads(out.read_text())["flips"]["wrong_to_right"] == 30
