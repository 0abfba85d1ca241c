"""A stage's time budget (telemetry/budget.py): from process start, in parts, the line people
read, and a pipeline run added up from the stages its dvc process ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from wellfed.telemetry import budget
from wellfed.telemetry.budget import START, Budget


def test_a_process_start_time_is_read_from_proc_to_a_few_hundredths():
    started = budget.process_started()
    assert started is not None and 0 < time.time() - started < 3600
    code = "import time; from wellfed.telemetry.budget import process_started as p; " \
           "print(time.time() - p())"
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    age = float(out.stdout)  # the child's age when it asked: its interpreter start and imports
    assert 0 < age < time.time() - before + 0.05


def test_the_budget_starts_at_process_start_and_says_what_no_part_covers():
    stage = Budget.begin("train", work="steps")
    assert list(stage.clock.seconds) == [START] and stage.clock.seconds[START] > 0
    with stage.clock("steps"):
        time.sleep(0.05)
    record = stage.record()
    assert record["stage"] == "train" and record["work"] == "steps"
    assert record["total_s"] == pytest.approx(record["ended_at"] - record["started_at"], abs=0.002)
    assert sum(record["parts_s"].values()) + record["other_s"] == pytest.approx(
        record["total_s"], abs=0.01)
    assert record["fixed_s"] == pytest.approx(record["total_s"] - record["parts_s"]["steps"],
                                              abs=0.002)


def test_the_line_shows_the_biggest_parts_and_sums_the_rest():
    record = {"stage": "train", "total_s": 60.0, "other_s": 1.0, "work": "steps", "fixed_s": 40.0,
              "parts_s": {START: 2.0, "steps": 20.0, "validation": 11.0, "a": 0.5, "b": 0.4,
                          "c": 0.3, "d": 0.2}}
    line = budget.line(record, top=4)
    assert line.startswith("train 60.0 s: steps 20.0, validation 11.0, start + imports 2.0, "
                           "other 1.0 (+4 more 1.4);")
    assert line.endswith("fixed cost (all but steps) 40.0 s")
    no_work = {k: v for k, v in record.items() if k not in ("work", "fixed_s")}
    assert "fixed cost" not in budget.line(no_work)  # prepare, tokenize: no steps to set apart


def stage_file(folder, stage, start, total, dvc, parts):
    record = {"stage": stage, "started_at": start, "ended_at": start + total, "total_s": total,
              "parts_s": parts, "other_s": 0.0, "dvc": dvc}
    if "steps" in parts:
        record.update(work="steps", fixed_s=total - parts["steps"])
    (folder / f"{stage}.json").write_text(json.dumps(record))
    return record


def test_a_pipeline_is_the_stages_of_one_dvc_process_and_dvcs_own_seconds(tmp_path):
    dvc = {"pid": 4242, "started_at": 1000.0}
    stage_file(tmp_path, "prepare", 1001.0, 1.0, {**dvc, "started_at": 1000.004}, {START: 0.5})
    stage_file(tmp_path, "tokenize", 1002.5, 2.0, dvc, {START: 1.0})
    stage_file(tmp_path, "old", 900.0, 5.0, {"pid": 4242, "started_at": 890.0}, {})  # pid reused
    stage_file(tmp_path, "other", 1001.0, 5.0, {"pid": 7, "started_at": 1000.0}, {})
    train = stage_file(tmp_path, "train", 1005.0, 10.0, dvc, {START: 1.0, "steps": 6.0})
    summary = budget.pipeline(tmp_path, train)
    assert [s["stage"] for s in summary["stages"]] == ["prepare", "tokenize", "train"]
    assert summary["total_s"] == 15.0 and summary["stages_s"] == {
        "prepare": 1.0, "tokenize": 2.0, "train": 10.0}
    assert summary["dvc_s"] == 2.0 and summary["fixed_s"] == 9.0
    assert budget.pipeline_line(summary) == (
        "pipeline 15.0 s since dvc started: train 10.0, tokenize 2.0, dvc 2.0, prepare 1.0; "
        "fixed cost (all but steps) 9.0 s")
    assert budget.pipeline(tmp_path, {**train, "dvc": None}) is None  # run by hand


def test_a_stage_run_by_hand_writes_its_budget_with_no_dvc_and_one_line(tmp_path):
    script = tmp_path / "stage.py"
    script.write_text("import time\nfrom wellfed.cli import stage\n\n@stage\n"
                      "def main(out, *, budget):\n    with budget.clock('work'):\n"
                      "        time.sleep(0.05)\n\nif __name__ == '__main__':\n    main()\n")
    out = tmp_path / "time" / "mine.json"
    proc = subprocess.run([sys.executable, str(script), "x", "--time", str(out)],
                          capture_output=True, text=True, env={**os.environ}, check=True)
    record = json.loads(out.read_text())
    assert record["stage"] == "mine" and record["dvc"] is None
    assert record["parts_s"]["work"] >= 0.05
    assert proc.stdout.strip().splitlines()[-1].startswith("[wellfed] mine ")
    bad = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert bad.returncode != 0 and "usage: stage.py out [--time TIME_JSON]" in bad.stderr
