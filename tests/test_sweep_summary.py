"""A sweep's parent run summarises its trials (wellfed.compare.sweep_summary), on a real sqlite
store: trials made directly (no training), each with planted predictions and its headline."""

from __future__ import annotations

import json
import statistics

import mlflow
import pytest
from sklearn.metrics import f1_score

from tests.test_compare_seeds import ranked, write_eval
from wellfed.compare import sweep_summary
from wellfed.compare.command import main
from wellfed.track import sweeps

# Two recipes of three seeds; a fourth trial of the first recipe inherited train.max_steps=30
# from the workspace when it was queued: a recipe of its own.
FAST, SLOW = [0.74, 0.83, 0.92], [0.80, 0.81, 0.79]


@pytest.fixture()
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    client.create_experiment("wellfed", artifact_location=str(tmp_path / "artifacts"))
    return uri, client


def trial(client, uri, tmp_path, sweep, params, gold, pred, finished=True) -> str:
    """One trial as the train and evaluate stages leave it: nested under the sweep's parent,
    its params, its evaluate artifacts and headline."""
    parent = sweeps.parent_run(uri, "wellfed", sweep)
    exp = client.get_experiment_by_name("wellfed").experiment_id
    run_id = client.create_run(exp, run_name=f"t{params['train.seed']}-{params['train.lr']}",
                               tags={sweeps.SWEEP_TAG: sweep,
                                     "mlflow.parentRunId": parent}).info.run_id
    for key, value in params.items():
        client.log_param(run_id, key, value)
    if finished:
        client.log_artifacts(run_id, str(write_eval(tmp_path / run_id, gold, pred)), "eval")
        client.log_metric(run_id, "eval/macro_f1", f1_score(gold, pred, average="macro"))
        client.set_terminated(run_id)
    return run_id


@pytest.mark.integration
def test_the_parent_run_holds_trials_recipes_best_and_the_verdict(store, tmp_path, capsys):
    uri, client = store
    gold, slow, fast = ranked(SLOW, FAST, rows=300)
    ids = []
    for seed, (s, f) in enumerate(zip(slow, fast), 1):
        ids.append(trial(client, uri, tmp_path, "grid", {"train.lr": "2e-05", "train.seed": seed,
                                                        "train.max_steps": 0}, gold, s))
        ids.append(trial(client, uri, tmp_path, "grid", {"train.lr": "0.0001", "train.seed": seed,
                                                        "train.max_steps": 0}, gold, f))
    leaked = trial(client, uri, tmp_path, "grid", {"train.lr": "0.0001", "train.seed": 4,
                                                   "train.max_steps": 30}, gold, fast[0])
    running = trial(client, uri, tmp_path, "grid", {"train.lr": "2e-05", "train.seed": 5,
                                                    "train.max_steps": 0}, gold, None, False)

    line = sweep_summary.after_trial(uri, leaked)  # as the trial's evaluate stage calls it
    assert line.startswith("sweep grid: 7 trial(s) evaluated, best ") and "summarises" in line
    parent = client.get_run(sweeps.parent_run(uri, "wellfed", "grid"))
    figures = {r: client.get_run(r).data.metrics["eval/macro_f1"] for r in ids + [leaked]}
    slow_f1, fast_f1 = [figures[r] for r in ids[0::2]], [figures[r] for r in ids[1::2]]
    m = parent.data.metrics
    assert m["sweep/trials"] == 7 and m["sweep/recipes"] == 3
    assert m["sweep/best/eval/macro_f1"] == pytest.approx(max(figures.values()))
    assert m["sweep/recipe1/mean/eval/macro_f1"] == pytest.approx(statistics.fmean(slow_f1))
    assert m["sweep/recipe2/sd/eval/macro_f1"] == pytest.approx(statistics.stdev(fast_f1))
    assert "sweep/recipe3/sd/eval/macro_f1" not in m  # one trial: no spread
    assert m["vs_seeds/accuracy_diff"] == pytest.approx(0.03)  # the two recipes of 3 seeds
    assert parent.data.tags["wellfed.sweep.recipe_keys"] == "train.lr, train.max_steps"
    note = parent.data.tags["mlflow.note.content"]
    best = max(figures, key=figures.get)
    assert note.startswith(f"### sweep grid: best recipe train.lr=0.0001 train.max_steps=0 "
                           f"eval/macro_f1 {statistics.fmean(fast_f1):.4f} ± "
                           f"{statistics.stdev(fast_f1):.4f}, the mean of its 3 trials; best "
                           f"trial {client.get_run(best).info.run_name} {figures[best]:.4f} "
                           "(train.lr=0.0001 train.max_steps=0, seed 3); 7 of 8 trials "
                           "evaluated, 1 running\n")
    assert (f"| train.lr=0.0001 train.max_steps=30 | 1 | {figures[leaked]:.4f} ± n/a | "
            f"{figures[leaked]:.4f} |") in note
    assert ("**verdict** B = train.lr=0.0001 train.max_steps=0, A = train.lr=2e-05 "
            "train.max_steps=0: B - A macro-F1 (the headline) +3.1 pt over 3 vs 3 seeds") in note
    assert note.count("?workflowType=machine_learning) |") == 8  # every trial, linked
    assert f"runs/{running}?workflowType=machine_learning) | train.lr=2e-05 " \
           "train.max_steps=0 | 5 | n/a | RUNNING |" in note
    ends = [client.get_run(r).info.end_time for r in ids + [leaked]]
    assert parent.info.status == "FINISHED" and parent.info.end_time == max(ends)

    # On demand: the same summary, shown, written again; an older one never overwrites it.
    out = tmp_path / "sweep.json"
    assert main(["sweep:grid", "--tracking-uri", uri, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "verdict: B = train.lr=0.0001 train.max_steps=0" in printed
    shown = printed.splitlines()
    start = shown.index(next(line for line in shown if line.startswith("recipe ")))
    table = shown[start:start + 4]  # the header and 3 recipes, the columns aligned
    assert table[0].split() == ["recipe", "trials", "eval/macro_f1", "mean", "±", "sd", "best"]
    assert len({len(line) for line in table}) == 1, table
    assert len({line.index(" ±") for line in table[1:]}) == 1, table
    assert any(line.startswith("train.lr=0.0001 train.max_steps=30") and
               line.split()[-4:] == ["0.7392", "±", "n/a", "0.7392"] for line in table)
    start = shown.index(next(line for line in shown if line.startswith("trial ")))
    trials = shown[start:start + 9]  # the header and 8 trials
    assert trials[0].split() == ["trial", "recipe", "seed", "eval/macro_f1", "status"]
    assert len({line.index(line.split()[-1]) for line in trials}) == 1, trials  # status
    assert "-" not in {word for line in trials for word in line.split()}
    summary = json.loads(out.read_text())
    assert summary["evaluated"] == 7 and len(summary["trials"]) == 8
    older = {**summary, "evaluated": 3}
    assert not sweep_summary.record(uri, older)
    assert client.get_run(parent.info.run_id).data.metrics["sweep/trials"] == 7


def test_one_recipe_gets_its_spread_and_no_verdict(store, tmp_path, monkeypatch):
    import socket

    from wellfed.track import ui_links

    uri, client = store
    gold, pred, _ = ranked(SLOW, FAST, rows=100)
    ids = [trial(client, uri, tmp_path, "seeds", {"train.lr": "2e-05", "train.seed": seed},
                 gold, p) for seed, p in enumerate(pred, 1)]
    with socket.socket() as listener:  # the sweep's link as evaluate's own run link is offered
        listener.bind(("127.0.0.1", 0))
        ui = f"http://127.0.0.1:{listener.getsockname()[1]}"
        monkeypatch.setattr(ui_links, "LOCAL_UI", ui)
        line = sweep_summary.after_trial(uri, ids[-1])  # no UI: evaluate's line said how
        assert line.startswith("sweep seeds: 3 trial(s) ") and line.endswith(" (after `make ui`)")
        assert "no UI is running" not in line and f"summarises them: {ui}/#/experiments/" in line
        listener.listen()  # `make ui` is up: the link as it is
        assert sweep_summary.after_trial(uri, ids[-1]).endswith("?workflowType=machine_learning")
    parent = client.get_run(sweeps.parent_run(uri, "wellfed", "seeds"))
    assert parent.data.tags["wellfed.sweep.recipe_keys"] == "-"
    assert "| (one recipe) | 3 |" in parent.data.tags["mlflow.note.content"]
    assert "**verdict** one recipe: nothing in this sweep to compare it with" in \
        parent.data.tags["mlflow.note.content"]
    assert not [k for k in parent.data.metrics if k.startswith("vs_seeds/")]
    # A run of no sweep: nothing to do; a store gone: a warning line, never an error.
    exp = client.get_experiment_by_name("wellfed").experiment_id
    assert sweep_summary.after_trial(uri, client.create_run(exp).info.run_id) == ""
    assert sweep_summary.after_trial(uri, "0" * 32).startswith(
        "WARNING: the sweep's summary was not updated (")


def test_a_sweep_of_seeds_alone_shows_no_recipe_column():
    trials = [{"name": f"t{i}", "recipe": "", "seed": str(i), "value": 0.8 + i / 100,
               "status": "FINISHED", "run_id": str(i)} for i in (1, 2)]
    summary = {"sweep": "seeds", "metric": "eval/macro_f1", "trials": trials, "evaluated": 2,
               "recipes": [{"recipe": "", "trials": 2, "mean": 0.815, "sd": 0.0071,
                            "best": 0.82}],
               "best": trials[1], "verdict": "one recipe: nothing to compare", "experiment_id": "0"}
    shown = sweep_summary.lines(summary, markdown=False)
    assert shown[0].startswith("sweep seeds: best recipe (the one recipe) eval/macro_f1 0.8150 "
                               "± 0.0071, the mean of its 2 trials; best trial t2 0.8200")
    assert shown[-3:] == ["trial  seed  eval/macro_f1  status",
                          "t1        1         0.8100  FINISHED",
                          "t2        2         0.8200  FINISHED"]
    note = sweep_summary.lines(summary, markdown=True)
    assert "| trial | seed | eval/macro_f1 | status |" in note
