"""wellfed.compare.seed_significance / wellfed-compare over groups of runs: the two-way bootstrap against
a slow reference, planted seed spread both ways, closed-form variances, refusals, sweeps."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import f1_score

from wellfed.compare import seed_significance, significance
from wellfed.compare.command import main
from wellfed.compare.prediction_sources import Scored
from wellfed.compare.seed_significance import compare_groups

LABELS = ["neg", "neu", "pos"]
ROWS = 1000


def ranked(accuracy_a, accuracy_b, rows=ROWS, seed=0):
    """Every run misses the hardest rows of one shared ranking, as many as its accuracy leaves:
    the runs' errors nest, so rows add little noise and the seeds' accuracies are the spread."""
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 3, size=rows)
    hardest = rng.permutation(rows)

    def run(accuracy):
        pred, wrong = gold.copy(), hardest[:round((1 - accuracy) * rows)]
        pred[wrong] = (gold[wrong] + 1) % 3
        return pred

    return gold, np.stack([run(x) for x in accuracy_a]), np.stack([run(x) for x in accuracy_b])


def own_misses(misses_a, misses_b, rows=ROWS, shared=100, seed=0):
    """Every run misses `shared` hard rows and its own random others (`misses` in all): equal
    accuracies within a group, but one run against another disagrees on many rows."""
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 3, size=rows)
    order = rng.permutation(rows)

    def run(misses):
        pred = gold.copy()
        wrong = np.concatenate([order[:shared], rng.choice(order[shared:], misses - shared,
                                                           replace=False)])
        pred[wrong] = (gold[wrong] + 1) % 3
        return pred

    return gold, np.stack([run(m) for m in misses_a]), np.stack([run(m) for m in misses_b])


def scored(ref, gold, pred, split="test", task="single_label", ids=None):
    names = np.array(LABELS, object)
    ids = np.arange(len(gold)) * 7 + 3 if ids is None else ids  # row ids are not positions
    frame = pd.DataFrame({"row_id": ids, "gold": names[gold], "predicted": names[pred]})
    return Scored(ref, f"planted {ref}", frame,
                  {"task": task, "split": split, "per_class": {k: {"label": k} for k in LABELS}})


def groups(gold, pred_a, pred_b):
    return ([scored(f"a{i}", gold, p) for i, p in enumerate(pred_a, 1)],
            [scored(f"b{i}", gold, p) for i, p in enumerate(pred_b, 1)])


def reference(gold, pred_a, pred_b, classes, resamples, seed):
    """The same two-way bootstrap written plainly: one resample at a time, each run's figures
    from numpy and sklearn on the drawn rows, the random draws in the library's order (A's
    seeds for every resample, B's, then each resample's rows)."""
    rng = np.random.default_rng(seed)
    seeds_a = [rng.integers(0, len(pred_a), size=len(pred_a)) for _ in range(resamples)]
    seeds_b = [rng.integers(0, len(pred_b), size=len(pred_b)) for _ in range(resamples)]
    every_row = np.arange(len(gold))

    def figures(rows):  # each run's accuracy and macro-F1 on these rows, A's runs then B's
        return {"accuracy": [np.mean(p[rows] == gold[rows]) for p in (*pred_a, *pred_b)],
                "macro_f1": [f1_score(gold[rows], p[rows], labels=list(range(classes)),
                                      average="macro", zero_division=0)
                             for p in (*pred_a, *pred_b)]}

    def diff(values, chosen_a, chosen_b):
        return (np.mean([values[len(pred_a) + j] for j in chosen_b])
                - np.mean([values[j] for j in chosen_a]))

    whole = figures(every_row)
    out = {m: {s: [] for s in seed_significance.SOURCES} for m in seed_significance.METRICS}
    everyone_a, everyone_b = range(len(pred_a)), range(len(pred_b))
    for r in range(resamples):
        drawn = figures(rng.integers(0, len(gold), size=len(gold)))
        for metric in out:
            out[metric]["both"].append(diff(drawn[metric], seeds_a[r], seeds_b[r]))
            out[metric]["rows"].append(diff(drawn[metric], everyone_a, everyone_b))
            out[metric]["seeds"].append(diff(whole[metric], seeds_a[r], seeds_b[r]))
    return out


def agrees_with_reference(gold, pred_a, pred_b, resamples, seed=7):
    fast = seed_significance.bootstrap(gold, pred_a, pred_b, 3, resamples, seed)
    slow = reference(gold, pred_a, pred_b, 3, resamples, seed)
    for metric in seed_significance.METRICS:
        for source in seed_significance.SOURCES:
            assert len(fast[metric][source]) == resamples
            np.testing.assert_allclose(fast[metric][source], slow[metric][source], rtol=0,
                                       atol=1e-12, err_msg=f"{metric} {source}")


@pytest.mark.integration
def test_a_row_level_win_is_within_noise_once_the_seed_spread_counts():
    """Planted: A's seeds score 80, 81, 79; B's 74, 83, 92 (mean +3 pt). Over the pooled runs
    the rows alone say B is better; B's seed-to-seed spread says nobody can tell yet."""
    gold, pred_a, pred_b = ranked([0.80, 0.81, 0.79], [0.74, 0.83, 0.92])
    out = compare_groups(*groups(gold, pred_a, pred_b))
    accuracy = out["accuracy"]
    assert accuracy["diff"] == pytest.approx(0.03)
    assert accuracy["a_sd"] == pytest.approx(0.01) and accuracy["b_sd"] == pytest.approx(0.09)
    assert accuracy["rows_ci95"][0] > 0  # row-level (seeds ignored): excludes 0
    assert accuracy["ci95"][0] < 0 < accuracy["ci95"][1]  # seed-aware: holds 0
    assert accuracy["seed_share"] > 0.9
    assert out["verdict"].startswith("B - A macro-F1 (the headline) +3.0 pt over 3 vs 3 seeds, 95% CI [-")
    assert ": within noise; the seed-to-seed spread (±" in out["verdict"]
    assert out["verdict"].endswith(" pt): run more seeds")
    # A single pair says something else again: one seed each, B1 (74) against A1 (80).
    single = significance.compare(scored("a1", gold, pred_a[0]), scored("b1", gold, pred_b[0]))
    assert single["verdict"].endswith(": B is worse")
    agrees_with_reference(gold, pred_a, pred_b, resamples=200)


@pytest.mark.integration
def test_a_real_effect_with_small_seed_spread_is_seen_where_one_pair_sees_noise():
    """Planted: six seeds a recipe, every A run at 80.0% and every B run at 82.0%, each missing
    its own rows besides 100 shared hard ones. One pair disagrees on ~160 rows: its paired
    interval holds 0. Six a side average the disagreement out: the seed-aware interval does
    not."""
    gold, pred_a, pred_b = own_misses([200] * 6, [180] * 6)
    out = compare_groups(*groups(gold, pred_a, pred_b))
    accuracy = out["accuracy"]
    assert accuracy["diff"] == pytest.approx(0.02)
    assert accuracy["a_sd"] == pytest.approx(0, abs=1e-12) == accuracy["b_sd"]
    assert accuracy["ci95"][0] > 0 and accuracy["rows_ci95"][0] > 0
    assert accuracy["seeds_ci95"] == pytest.approx([0.02, 0.02])
    assert accuracy["seed_share"] == pytest.approx(0, abs=1e-9)
    assert out["verdict"].startswith("B - A macro-F1 (the headline) +2.0 pt over 6 vs 6 seeds, 95% CI [+")
    assert out["verdict"].endswith(": B is better; the row sampling (±1.0 pt) dominates the "
                                   "seed-to-seed spread (±0.0 pt)")
    single = significance.compare(scored("a1", gold, pred_a[0]), scored("b1", gold, pred_b[0]))
    low, high = single["accuracy"]["ci95"]
    assert low < 0 < high and single["verdict"].endswith(": within noise")
    agrees_with_reference(gold, pred_a, pred_b, resamples=100)


def test_each_source_alone_matches_its_closed_form_variance():
    """Seeds alone: a mean of r runs drawn with replacement has variance s^2 / r (s^2 over the
    runs, ddof 0), per group. Rows alone: accuracy's difference is a mean over rows of d_i (B's
    mean hit minus A's), variance var(d) / n. 4,000 resamples: within 10%."""
    gold, pred_a, pred_b = own_misses([190, 200, 215, 205], [170, 185, 175, 190], seed=3)
    diffs = seed_significance.bootstrap(gold, pred_a, pred_b, 3, resamples=4000, seed=1)
    acc_a, acc_b = (np.mean(p == gold, axis=1) for p in (pred_a, pred_b))
    seeds = np.var(acc_a) / len(acc_a) + np.var(acc_b) / len(acc_b)
    d = np.mean(pred_b == gold, axis=0) - np.mean(pred_a == gold, axis=0)
    rows = np.var(d) / len(gold)
    assert np.var(diffs["accuracy"]["seeds"]) == pytest.approx(seeds, rel=0.1)
    assert np.var(diffs["accuracy"]["rows"]) == pytest.approx(rows, rel=0.1)
    both = np.var(diffs["accuracy"]["both"])
    assert seeds + rows < both < 1.5 * (seeds + rows)  # conservative, by the interaction


@pytest.mark.parametrize("change, words", [
    ("rows", "A1 and B2 scored different rows (A1 1000, B2 1000, 999 shared); compare runs "
             "evaluated on the same split of the same prepared data"),
    ("split", "A1 scored the test split and B2 the validation split; compare runs evaluated on "
              "the same split"),
    ("multi_label", "B2 (b2) is a multi_label run: compare is not supported yet for multi_label "
                    "(single_label only)"),
    ("regression", "B2 (b2) is a regression run: compare is not supported yet for regression"),
    ("one", "A has 1 run and B 2: a comparison over seeds needs at least 2 runs on each side"),
    ("twice", "B1 and B2 are the same run (planted b1); name each seed's run once"),
])
def test_groups_that_cannot_be_compared_are_refused_in_one_line(change, words):
    gold, pred_a, pred_b = ranked([0.8, 0.8], [0.82, 0.84])
    a, b = groups(gold, pred_a, pred_b)
    if change == "rows":
        ids = np.arange(ROWS) * 7 + 3
        ids[0] = -1
        b[1] = scored("b2", gold, pred_b[1], ids=ids)
    elif change in ("split", "multi_label", "regression"):
        b[1] = scored("b2", gold, pred_b[1], *(("validation",) if change == "split" else
                                                ("test", change)))
    elif change == "one":
        a = a[:1]
    else:
        b[1] = b[0]
    with pytest.raises(ValueError) as err:
        compare_groups(a, b)
    assert words in str(err.value) and "\n" not in str(err.value)


def write_eval(folder, gold, pred):
    run = scored("x", gold, pred)
    folder.mkdir(parents=True)
    run.frame.to_parquet(folder / "predictions.parquet", index=False)
    (folder / "report.json").write_text(json.dumps(run.report))
    return folder


def test_two_sweeps_compare_and_log_a_run_of_their_own(tmp_path, capsys):
    """`sweep:<id>` is every finished run tagged wellfed.sweep=<id>, not a parent run nor one
    still running; the same runs named one by one with --vs give the same result; the
    comparison is a run of its own beside B's, which sweep: never picks up."""
    import mlflow

    gold, pred_a, pred_b = ranked([0.80, 0.81, 0.79], [0.74, 0.83, 0.92], rows=300)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("seeds", artifact_location=str(tmp_path / "artifacts"))
    ids = {"x": [], "y": []}
    for sweep, preds in (("x", pred_a), ("y", pred_b)):
        parent = client.create_run(exp, tags={"wellfed.sweep": sweep}).info.run_id
        for i, pred in enumerate(preds):
            run_id = client.create_run(exp, tags={"wellfed.sweep": sweep,
                                                  "mlflow.parentRunId": parent}).info.run_id
            client.log_artifacts(run_id, str(write_eval(tmp_path / f"{sweep}{i}", gold, pred)),
                                 "eval")
            client.set_terminated(run_id)
            ids[sweep].append(run_id)
    running = client.create_run(exp, tags={"wellfed.sweep": "y"}).info.run_id
    out = tmp_path / "seeds.json"
    assert main(["sweep:x", "sweep:y", "--tracking-uri", uri, "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert f"sweep:y: left out 1 unfinished runs ({running} RUNNING)" in printed.err
    assert "verdict: B - A macro-F1 (the headline) +3.1 pt over 3 vs 3 seeds" in printed.out
    assert f"\nA1     0.8000   0.7981  MLflow run {ids['x'][0]} (sweep:x) in {uri}\n" in printed.out
    result = json.loads(out.read_text())
    assert [r["mlflow_run_id"] for r in result["b"]["runs"]] == ids["y"]
    assert result["a"]["specs"] == ["sweep:x"] and result["rows"] == 300

    logged = [r for r in client.search_runs([exp]) if r.data.tags.get("wellfed.compare")]
    assert len(logged) == 1
    summary = logged[0]
    assert summary.info.run_name == "compare sweep:x vs sweep:y"
    assert summary.data.tags["wellfed.compare.b_runs"] == ",".join(ids["y"])
    assert summary.data.metrics["vs_seeds/accuracy_diff"] == pytest.approx(0.03)
    assert len(summary.data.metrics) == 19 and "verdict:" in summary.data.tags[
        "mlflow.note.content"]
    assert json.loads(mlflow.artifacts.load_text(
        f"{summary.info.artifact_uri}/compare/groups.json")) == result
    assert not [k for i in ids["y"] for k in client.get_run(i).data.metrics]  # B's runs untouched

    one_by_one = tmp_path / "one_by_one.json"
    assert main([*ids["x"], "--vs", *ids["y"], "--tracking-uri", uri, "--no-log",
                 "--out", str(one_by_one)]) == 0
    again = json.loads(one_by_one.read_text())
    assert again["accuracy"] == result["accuracy"] and again["verdict"] == result["verdict"]
    assert main(["sweep:z", "sweep:y", "--tracking-uri", uri]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"error: sweep:z: no finished MLflow run tagged wellfed.sweep='z' in {uri}; "
                   f"name the sweep's id as its trials were tagged, or list their runs")


def test_folders_as_groups_and_single_runs_keep_the_paired_test(tmp_path, capsys):
    gold, pred_a, pred_b = own_misses([200] * 3, [180] * 3, rows=400)
    a = [str(write_eval(tmp_path / f"a{i}", gold, p)) for i, p in enumerate(pred_a)]
    b = [str(write_eval(tmp_path / f"b{i}", gold, p)) for i, p in enumerate(pred_b)]
    assert main([*a, "--vs", *b]) == 0
    printed = capsys.readouterr()
    assert "over 3 vs 3 seeds" in printed.out and "rows only" in printed.out
    assert "not logged to MLflow: none of B's runs is an MLflow run" in printed.err
    for argv in ([a[0], b[0]], [a[0], "--vs", b[0]]):  # one run a side: today's paired test
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "McNemar exact p" in out and "verdict: B - A macro-F1 (the headline)" in out and "seeds" not in out
    with pytest.raises(SystemExit) as exit_:
        main([*a])
    assert exit_.value.code == 2
    assert ("give two runs (A B), two groups (A1 A2 ... --vs B1 B2 ...) or one sweep "
            "(sweep:<id>); got 3 runs") in capsys.readouterr().err


def test_groups_whose_runs_differ_in_more_than_the_seed_are_refused_unless_asked(tmp_path,
                                                                                 capsys):
    """`a b c --vs main variant`: main and variant differ in train.lr and train.max_steps, so
    their spread is not seed noise; the comparison says so and stops, or, with
    --mixed-recipes, runs and says it in the table, the verdict and the run's tag. Params that
    make no other recipe (mlflow.*, ray.num_workers) and the seed itself do not count."""
    import mlflow

    gold, pred_a, pred_b = ranked([0.80, 0.81, 0.79], [0.74, 0.92], rows=300)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("seeds", artifact_location=str(tmp_path / "artifacts"))
    recipes = [{"train.lr": "0.0001", "train.max_steps": "0", "train.seed": str(seed),
                "ray.num_workers": str(seed), "mlflow.sweep": f"s{seed}"} for seed in (1, 2, 3)]
    recipes += [{"train.lr": "0.0001", "train.max_steps": "0", "train.seed": "1"},  # main
                {"train.lr": "0.0003", "train.max_steps": "30", "train.seed": "1"}]  # variant
    ids = []
    for i, (params, pred) in enumerate(zip(recipes, [*pred_a, *pred_b])):
        run_id = client.create_run(exp).info.run_id
        client.log_batch(run_id, params=[mlflow.entities.Param(k, v) for k, v in params.items()])
        client.log_artifacts(run_id, str(write_eval(tmp_path / f"r{i}", gold, pred)), "eval")
        client.set_terminated(run_id)
        ids.append(run_id)
    args = [*ids[:3], "--vs", *ids[3:], "--tracking-uri", uri]
    assert main(args) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: B's 2 runs are not seeds of one recipe: they differ in train.lr (0.0001, "
        "0.0003), train.max_steps (0, 30), not only in train.seed: their spread would be "
        "counted as seed noise; compare each recipe's seeds as a group (A1 A2 --vs B1 B2), or "
        "pass --mixed-recipes to compare them anyway")
    assert not [r for r in client.search_runs([exp]) if r.data.tags.get("wellfed.compare")]

    assert main([*args, "--mixed-recipes"]) == 0
    out = capsys.readouterr().out
    assert ("WARNING: B's 2 runs are not seeds of one recipe: they differ in train.lr (0.0001, "
            "0.0003), train.max_steps (0, 30), not only in train.seed: the seeds-only figures "
            "count recipe differences as seed noise") in out
    assert "verdict: B - A macro-F1 (the headline) +3.2 pt over 3 vs 2 runs of mixed recipes" in out
    logged = [r for r in client.search_runs([exp]) if r.data.tags.get("wellfed.compare")]
    assert [r.data.tags["wellfed.compare"] for r in logged] == ["mixed recipes"]
