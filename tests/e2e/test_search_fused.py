"""wellfed-search with fused trials (search.fuse true), as a user runs it on the tiny model:
killed outright (SIGKILL) inside a group on its way to the second rung, resumed to the end of
the search phase and the final check, both fused. Checks that K is chosen and recorded, that
the search halves in step across all its trials (the stopped trials say at which rung, against
which cutoff, among how many), that the resumed search trains nothing before each trial's last
rung again, that the final check trains its runs fused by seed on this CPU (across seeds is for
a GPU: search/halving.py's proof_grouping, tests/search/test_trial.py) and reuses the
finalist's own full-budget trial for its seed, and that every child run ends FINISHED."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time

import pytest

from tests.e2e.pipeline import env, mlflow_runs
from tests.e2e.test_search import ledger, search, search_project

pytestmark = [pytest.mark.e2e]
TRIALS, SEEDS = 6, [1, 2]
SEARCH = {"trials": TRIALS, "min_steps": 4, "max_steps": 16, "reduction_factor": 2,
          "finalists": 2, "seeds": SEEDS, "fuse": "true",
          "space": {"train": {"lr": "log_uniform 1e-4 5e-2", "warmup_ratio": "uniform 0.0 0.2"}}}


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir):
    return search_project(tmp_path_factory.mktemp("search-fused"), tiny_model_dir, SEARCH)


def killed_at_a_rung(project) -> tuple[int, str]:
    """wellfed-search, killed outright (SIGKILL) as soon as a group going to the second rung
    (step 8) wrote a trial's state there, before the search recorded it (the group trains
    inside one Ray task and prints nothing until it ends: the file says it)."""
    proc = subprocess.Popen(["wellfed-search", "--no-exp"], cwd=project, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 900
    while proc.poll() is None and time.time() < deadline:
        if list(project.glob("data/search/*/groups/*@8.pt")):
            proc.kill()
            break
        time.sleep(0.05)
    code = proc.wait(timeout=120)
    reader.join(timeout=30)
    return code, "".join(lines)


def test_a_fused_search_killed_inside_a_group_goes_on_from_its_rung_and_proves_fused(project):
    code, out = killed_at_a_rung(project)
    assert code == -signal.SIGKILL, out[-3000:]
    chosen = [line for line in out.splitlines() if line.startswith("[wellfed] fused trials: ")]
    assert len(chosen) == 1 and "per group, successive halving in step" in chosen[0], out[-3000:]
    k = int(chosen[0].split()[3])
    assert 2 <= k <= TRIALS
    before = {t: e for t, e in ledger(project).items() if e["phase"] == "search"}
    assert len(before) == TRIALS - TRIALS // 2  # stopped at rung 1 before the group to rung 2

    code, out = search(project, "--no-exp")
    assert code == 0, out[-3000:]
    assert (f"resuming: {TRIALS} of {TRIALS} search trials reached the first rung, "
            f"{len(before)} of them ended") in out, out[-3000:]
    # nothing before each trial's last rung trained again: the group cut off goes on from step 4
    assert not re.search(r"to rung 1 of 3", out), out[-3000:]
    # the best 3 go on from step 4 in groups of at most K (K is this run's measure: at K = 2,
    # two groups, of which the kill may have found the first already recorded)
    groups = re.findall(r"^\[wellfed\] search: to rung 2 of 3 \(step 8\), group \d+/(\d+): "
                        rf"(\d+) trial\(s\) fused, the best {TRIALS // 2} of the {TRIALS} at "
                        "step 4", out, re.M)
    assert groups and all(int(n) == len(groups) for n, _ in groups), out[-3000:]
    assert all(1 <= int(size) <= k for _, size in groups), out[-3000:]
    assert sum(int(size) for _, size in groups) <= TRIALS // 2, out[-3000:]
    after = ledger(project)
    assert {t: after[t] for t in before} == before  # kept, not trained again
    assert not list(project.glob("data/search/*/groups/*"))  # every trial's state spent
    searched = {t: e for t, e in after.items() if e["phase"] == "search"}
    assert len(searched) == TRIALS
    # successive halving across the search: 6 at step 4, the best 3 at 8, the best 1 at 16
    steps = sorted(int(e["reports"][-1]["step"]) for e in searched.values())
    assert steps == [4, 4, 4, 8, 8, 16], steps
    # 2 finalists x 2 seeds, one of them the finalist's own search trial: 3 runs, by seed on a
    # CPU (K >= 2): seed 1's one run, then seed 2's two as one group; no padding to pay
    assert ("[wellfed] final check: 3 run(s) to train, fused by seed in groups of up to "
            f"{k} (a CPU") in out, out[-3000:]
    proofs = re.findall(r"^\[wellfed\] proof group (\d+)/(\d+): (\d+) trial\(s\) fused", out,
                        re.M)
    assert [(int(n), int(size)) for _, n, size in proofs] == [(2, 1), (2, 2)], out[-3000:]
    assert "padded to one shape" not in out

    client, runs = mlflow_runs(project)
    by_phase: dict[str, list] = {}
    for r in runs:
        by_phase.setdefault(r.data.tags.get("wellfed.search.phase"), []).append(r)
    (parent,) = by_phase["parent"]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["search.fused_trials"] == str(k)
    assert parent.data.tags["wellfed.search.fused"].startswith(f"K={k}: ")
    assert len(by_phase["search"]) == TRIALS and len(by_phase["proof"]) == 2 * len(SEEDS)
    for child in by_phase["search"] + by_phase["proof"]:
        assert child.info.status == "FINISHED", child.data.tags
        history = client.get_metric_history(child.info.run_id, "train/loss")
        assert len({m.step for m in history}) == len(history)
    outcomes = [c.data.tags["wellfed.search.outcome"] for c in by_phase["search"]]
    stopped = [o for o in outcomes if o.startswith("stopped by successive halving at rung 1")]
    assert len(stopped) == 3 and all("the cutoff" in o and "(the best 3 of the 6 in the "
                                     "search go on)" in o for o in stopped), outcomes
    # the finalist that reached the full budget at seed 1 is that seed's final-check run
    proof_runs = [e for e in after.values() if e["phase"] == "proof"]
    full = [e for e in searched.values() if int(e["reports"][-1]["step"]) == 16]
    reused = [e for e in proof_runs if e["config"]["proof"]["seed"] == SEEDS[0]
              and any(e["reports"] == [{**r, "phase": "proof"} for r in f["reports"]]
                      for f in full)]
    assert reused, "the finalist's own full-budget trial was trained again"
    result = json.loads(next(project.glob("data/search/*/result.json")).read_text())
    assert result["final_check"]["call"] in ("beats", "indistinguishable")
