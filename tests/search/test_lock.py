"""One search per project: a second `wellfed-search` is refused in one line naming the first
(its pid and search id); the kernel frees the lock of a search killed outright. A search beside
a running `dvc exp run` says in one whole line which holds what and what to run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests.e2e.pipeline import PROJECT, env
from wellfed.search import lock

HOLDER = ("import sys, time\n"
          "from pathlib import Path\n"
          "from wellfed.search import lock\n"
          "with lock.held(Path(sys.argv[1])):\n"
          "    lock.name(Path(sys.argv[1]), 's-0123456789')\n"
          "    print('held', flush=True)\n"
          "    time.sleep(600)\n")


@pytest.fixture
def holder(tmp_path):
    """Another process holding `tmp_path/data/search`'s lock; killed (SIGKILL) at the end."""
    folder = tmp_path / "data" / "search"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(PROJECT / "src")})
    try:
        assert proc.stdout.readline().strip() == "held"
        yield folder, proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_search_is_refused_naming_the_first_and_the_lock_dies_with_it(holder):
    folder, proc = holder
    with pytest.raises(ValueError) as refused:
        with lock.held(folder):
            pass
    line = str(refused.value)
    assert f"another wellfed-search runs in this project (pid {proc.pid}, search s-0123456789" \
        in line and f"`kill -TERM {proc.pid}`" in line and "\n" not in line
    proc.send_signal(signal.SIGKILL)  # no way to clean up: the kernel frees the lock
    proc.wait()
    with lock.held(folder):
        lock.name(folder, "s-second")
        assert '"search_id": "s-second"' in (folder / lock.NAME).read_text()


def test_wellfed_search_refuses_to_start_beside_a_running_search(holder, tmp_path):
    folder, proc = holder
    shutil.copy(PROJECT / "params.yaml", tmp_path / "params.yaml")
    out = subprocess.run(["wellfed-search", "--no-exp"], cwd=tmp_path, env=env(),
                         capture_output=True, text=True, timeout=120)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 1 and len(errors) == 1, out.stderr[-2000:]
    assert f"(pid {proc.pid}, search s-0123456789" in errors[0]
    assert not (tmp_path / "data" / "tokens").exists()  # refused before `dvc repro tokenize`


# dvc 3.x's message (dvc/rwlock.py) for a stage's output another dvc process reads or writes
DVC_BUSY = """ERROR: '{root}/data/reports/tokens.json' is busy, it is being blocked by:
  (PID 4242): dvc exp run -S train.lr=1e-4

If there are no processes with such PIDs, you can manually remove '.dvc/tmp/rwlock' and try again.
"""


def test_dvcs_busy_lock_becomes_one_whole_line_with_the_holder_and_the_fix(tmp_path):
    text = DVC_BUSY.format(root=tmp_path.resolve())
    line = lock.dvc_busy(text, tmp_path, "then rerun `wellfed-search`")
    assert line == ("data/reports/tokens.json is in use by `dvc exp run -S train.lr=1e-4` "
                    "(pid 4242), which runs the pipeline in this project: wait for it to finish "
                    "(or stop it), then rerun `wellfed-search`")
    assert lock.dvc_busy("ERROR: failed to reproduce 'tokenize'", tmp_path, "") is None


def test_the_search_says_dvcs_busy_lock_in_one_line(tmp_path, monkeypatch):
    from wellfed.search import command

    monkeypatch.chdir(tmp_path)
    text = DVC_BUSY.format(root=tmp_path.resolve())
    monkeypatch.setattr(command.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 255, stdout="", stderr=text))
    with pytest.raises(ValueError) as err:
        command.tokens_ready("params.yaml")
    assert str(err.value) == ("`dvc repro tokenize` cannot run before the search: "
                              "data/reports/tokens.json is in use by `dvc exp run -S "
                              "train.lr=1e-4` (pid 4242), which runs the pipeline in this "
                              "project: wait for it to finish (or stop it), then rerun "
                              "`wellfed-search`")


def test_the_winners_experiment_beside_a_dvc_exp_run_says_the_lock_in_one_line(tmp_path):
    """The winner's closing `dvc exp run` beside another one ended in DVC's cut-off multi-line
    message and 'failed (exit 255)'. Its output goes to the terminal (the stages' bars, a
    stop's lines), so the holder is read from DVC's own lock file."""
    import json
    import os

    from wellfed.search import winner

    result = tmp_path / "data/search/s-1/result.json"
    assert winner.failed(255, tmp_path, result) == (
        f"the winner's `dvc exp run` failed (exit 255); its params are in {result}")
    (tmp_path / ".dvc/tmp").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".dvc/tmp/rwlock").write_text(json.dumps({
            "write": {str(tmp_path.resolve() / "data/train"): {
                "pid": holder.pid, "cmd": "dvc exp run -S train.lr=1e-4"}},
            "read": {str(tmp_path.resolve() / "params.yaml"): [
                {"pid": os.getpid(), "cmd": "ours"}]}}))
        assert winner.failed(255, tmp_path, result) == (
            "the winner's `dvc exp run` could not run: data/train is in use by `dvc exp run -S "
            f"train.lr=1e-4` (pid {holder.pid}), which runs the pipeline in this project: wait "
            "for it to finish (or stop it), then run the winner with the command above (its "
            f"params: {result})")
    finally:
        holder.kill()
        holder.wait()
    assert winner.failed(255, tmp_path, result).endswith("failed (exit 255); its params are in "
                                                         f"{result}")  # the holder is gone
