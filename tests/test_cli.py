"""The stage wrapper: every failure is one `error:` line on stderr and exit code 1."""

import os
import subprocess
import sys

import pytest

SCRIPT = '''
import sys
from wellfed.cli import stage
from wellfed.train.run.failures import TrainingFailed

def fails_deep(kind):
    if kind == "mlflow":
        import mlflow
        mlflow.MlflowClient(sys.argv[2]).get_run("0" * 32)
    if kind == "workers":
        raise TrainingFailed("training failed (worker 1: RuntimeError: loss was not finite)")
    if kind == "bug":
        return {}["missing"]
    if kind == "ctrl-c":
        raise KeyboardInterrupt
    if kind == "ctrl-c-train":
        from wellfed.cli import Interrupted
        raise Interrupted("training stopped by Ctrl-C (the checkpoint of step 40 is kept): rerun")
    raise ValueError("train.lr must be a number; got 'fast'\\nsecond line")

@stage
def main(kind, uri):
    fails_deep(kind)

if __name__ == "__main__":
    main()
'''

CASES = {
    "mlflow": "error: MLflow failed in toy.fails_deep (called from toy.py line 9): Run with id=",
    "workers": "error: training failed (worker 1: RuntimeError: loss was not finite)",
    "value": "error: train.lr must be a number; got 'fast' second line",
    "bug": "error: unexpected KeyError at toy.py:13: 'missing'; this is a bug in wellfed, please "
           "report it (the traceback is in ",
}


def run_toy(tmp_path, kind, **env):
    (tmp_path / "toy.py").write_text(SCRIPT)
    return subprocess.run([sys.executable, "toy.py", kind, f"sqlite:///{tmp_path / 'm.db'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(tmp_path), **env})


@pytest.mark.integration
@pytest.mark.parametrize("kind", list(CASES))
def test_every_failure_is_one_line(tmp_path, kind):
    proc = run_toy(tmp_path, kind)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(CASES[kind]), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.integration
def test_a_bug_keeps_its_traceback_in_a_file_or_on_request(tmp_path):
    proc = run_toy(tmp_path, "bug")
    saved = proc.stderr.strip().rsplit("the traceback is in ", 1)[1].removesuffix(")")
    text = open(saved, encoding="utf-8").read()
    assert text.startswith("Traceback (most recent call last):") and "KeyError: 'missing'" in text
    loud = run_toy(tmp_path, "bug", WELLFED_TRACEBACK="1")
    assert loud.returncode == 1 and "Traceback" in loud.stderr and "error:" not in loud.stderr


def test_case_table_is_complete():
    assert len(CASES) == 4


@pytest.mark.parametrize("kind, line", [
    ("ctrl-c", "[wellfed] stopped by Ctrl-C; stages already finished are kept: rerun `dvc repro`"),
    ("ctrl-c-train", "[wellfed] training stopped by Ctrl-C (the checkpoint of step 40 is kept)")])
def test_ctrl_c_is_one_line_saying_where_it_stopped(tmp_path, kind, line):
    proc = run_toy(tmp_path, kind)
    assert proc.returncode == 130
    assert proc.stderr.strip().startswith(line) and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
