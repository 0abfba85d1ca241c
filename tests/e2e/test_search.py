"""wellfed-search as a user runs it, on the tiny model: stopped by Ctrl-C (SIGINT) after two
trials, resumed and killed outright (SIGKILL) two trials later, resumed again to the final check
and the winner's `dvc exp run`, one trial at a time with ASHA (search.fuse false; the fused
search: tests/e2e/test_search_fused.py). Checks the story MLflow tells (one parent, a child per
trial, ASHA's stops with their reasons), that no finished trial trains twice, and that the
winner's pipeline run learns what its warm trial learned."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.pipeline import env, make_project, mlflow_runs, run

pytestmark = [pytest.mark.e2e]
TRIALS, SEEDS = 6, [1, 2]
# params.yaml asks 16 trials and 3 seeds; every run says --trials 6 --seeds 1,2 (not written)
OPTIONS = ("--trials", str(TRIALS), "--seeds", ",".join(map(str, SEEDS)))
SEARCH = {"trials": 16, "min_steps": 4, "max_steps": 16, "reduction_factor": 2,
          "finalists": 2, "seeds": [1, 2, 3], "concurrent": 1, "fuse": "false",
          "space": {"train": {"lr": "log_uniform 1e-4 5e-2", "warmup_ratio": "uniform 0.0 0.2"}}}


def search_project(dest: Path, tiny_model_dir: Path, search_section: dict) -> Path:
    """A tiny-model project whose params.yaml holds `search_section` (this module's and the
    fused search's)."""
    make_project(dest, {"model": {"name": str(tiny_model_dir), "init": "random"},
                        "train": {"epochs": 1, "lr": 2e-3, "global_batch_size": 16,
                                  "micro_batch_size": 16, "report_every": 4, "eval_every": 0},
                        "ray": {"num_workers": 1, "cpus_per_worker": 1},
                        "search": search_section})
    return dest


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir):
    return search_project(tmp_path_factory.mktemp("search"), tiny_model_dir, SEARCH)


def search(project: Path, *args: str, stop_after: int | None = None,
           how: int = signal.SIGTERM):
    """Run wellfed-search; with `stop_after`, send it `how` once that many trials finished."""
    proc = subprocess.Popen(["wellfed-search", *args], cwd=project, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines, sent = [], False
    deadline = time.time() + 900
    for line in proc.stdout:
        lines.append(line)
        if stop_after and not sent and line.startswith(f"[wellfed] search {stop_after}/"):
            proc.send_signal(how)
            sent = True
        if time.time() > deadline:
            proc.kill()
    return proc.wait(timeout=120), "".join(lines)


def ledger(project: Path) -> dict[str, dict]:
    found = {}
    for path in project.glob("data/search/*/finished/*.json"):
        found[path.stem] = json.loads(path.read_text())
    return found


def test_a_search_stopped_then_killed_resumes_proves_its_winner_and_runs_it(project):
    searched = yaml.safe_load((project / "params.yaml").read_text())["search"]
    # Ctrl-C (the SIGTERM to a search's group: test_search_faults)
    code, out = search(project, *OPTIONS, stop_after=2, how=signal.SIGINT)
    assert code == 130, out[-3000:]
    assert "stopped by Ctrl-C (SIGINT): finished trials are kept" in out
    before = {t: e for t, e in ledger(project).items() if e["phase"] == "search"}
    assert len(before) >= 2
    client, runs = mlflow_runs(project)
    parents = [r for r in runs if r.data.tags.get("wellfed.search.phase") == "parent"]
    assert len(parents) == 1 and parents[0].info.status == "KILLED"

    # resumed, then killed outright (SIGKILL: no state saved on the way out) two trials later
    code, out = search(project, *OPTIONS, stop_after=len(before) + 2, how=signal.SIGKILL)
    assert code == -signal.SIGKILL, out[-3000:]
    killed = {t: e for t, e in ledger(project).items() if e["phase"] == "search"}
    assert len(killed) >= len(before) + 2
    assert {t: killed[t] for t in before} == before  # what finished before the stop is kept

    code, out = search(project, *OPTIONS)
    assert code == 0, out[-3000:]
    # the options were not written (the winner's `dvc exp run -S` sets its train keys only)
    assert yaml.safe_load((project / "params.yaml").read_text())["search"] == searched
    after = ledger(project)
    assert {t: after[t] for t in killed} == killed
    # no finished trial trained again: progress goes on from where it was, and a trial that
    # finished after Ray Tune last saved its state is handed back, not trained
    trained = [line for line in out.splitlines() if line.startswith("[wellfed] search ")
               and "/" in line.split()[2] and "not trained again" not in line]
    assert trained and all(int(line.split()[2].split("/")[0]) > len(killed) for line in trained)
    searched = [e for e in after.values() if e["phase"] == "search"]
    # a trial that finished in Tune's last turn before the kill is kept, and Tune proposes one
    # in its place: at most one more than asked
    assert TRIALS <= len(searched) <= TRIALS + 1
    assert max(int(line.split()[2].split("/")[0]) for line in trained) == len(searched)

    client, runs = mlflow_runs(project)
    by_phase: dict[str, list] = {}
    for r in runs:
        by_phase.setdefault(r.data.tags.get("wellfed.search.phase"), []).append(r)
    (parent,) = by_phase["parent"]
    assert parent.info.run_id == parents[0].info.run_id and parent.info.status == "FINISHED"
    assert parent.data.params["search.options"] == "--trials 6 --seeds 1,2"
    assert parent.data.params["search.trials"] == "6"
    assert len(by_phase["search"]) == len(searched) and len(by_phase["proof"]) == 2 * len(SEEDS)
    for child in by_phase["search"] + by_phase["proof"]:
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        history = client.get_metric_history(child.info.run_id, "train/loss")
        assert len({m.step for m in history}) == len(history)  # no step logged twice
    outcomes = [c.data.tags["wellfed.search.outcome"] for c in by_phase["search"]]
    stopped = [o for o in outcomes if o.startswith("stopped by ASHA at rung")]
    assert stopped and all("the cutoff" in o for o in stopped)
    note = parent.data.tags["mlflow.note.content"]
    assert "**Winner:**" in note and "**Final check:**" in note and "ASHA stopped" in note
    assert "the mean over seeds 1, 2 (final check" in note
    winner_line = next(line for line in out.splitlines() if ": the winner is " in line)
    assert "the mean over seeds 1, 2" in winner_line  # the proven figure leads
    assert parent.data.metrics["search/trials"] == len(searched)
    assert parent.data.metrics["search/steps"] < parent.data.metrics["search/grid_steps"]

    (winner,) = by_phase["winner"]
    assert winner.data.tags["mlflow.parentRunId"] == parent.info.run_id
    result = json.loads(next(project.glob("data/search/*/result.json")).read_text())
    assert result["equal_learning"]["same"], result["equal_learning"]
    assert result["final_check"]["call"] in ("beats", "indistinguishable")
    exps = run(["dvc", "exp", "list", "--name-only"], project).stdout.split()
    assert result["winner_exp"] in exps
    params = run(["dvc", "params", "diff", "HEAD", "--md"], project).stdout
    assert "train.max_steps" in params and "train.lr" in params


def test_bad_search_params_fail_in_one_line_before_any_trial(project):
    text = (project / "params.yaml").read_text()

    params = yaml.safe_load(text)
    params["search"]["metric"] = "val/pearson"
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        code, out = search(project)
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert code == 1 and len(errors) == 1, out[-2000:]
        assert "search.metric 'val/pearson' is not a validation figure of this single_label " \
               "task" in errors[0] and "use auto (val/macro_f1)" in errors[0]
        assert "trial" not in out.replace(errors[0], "")
    finally:
        (project / "params.yaml").write_text(text)
