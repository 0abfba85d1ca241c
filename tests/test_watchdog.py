"""A stage never outlives the dvc that runs it (wellfed/watchdog.py): dvc killed alone (its pid,
not its group) stops the stage within a poll, through a shell that forks the stage (dash) or
one that execs it (bash); once the train stage has set `finish_when_orphaned`, the stage
finishes instead; a stage run by hand outlives a parent that exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import PROJECT

# The stage: wellfed's entry point around a wait, as a stage's work is; it prints its pid.
# "stop": waits to be stopped. Otherwise it waits until dvc is gone, however long the test
# takes to kill it (counted: the parents change; a fixed sleep could end first on a loaded
# machine), and, under dvc, until the watchdog has said so; then it finishes. `seconds`
# bounds every wait, so that a broken watchdog fails the test instead of leaving a process.
STAGE = textwrap.dedent("""
    import os, sys, threading, time
    from wellfed import watchdog
    from wellfed.cli import guarded

    def work():
        mode, seconds = sys.argv[1], float(sys.argv[2])
        if mode == "finish":  # before the pid, which tells the test to kill dvc
            watchdog.finish_when_orphaned()
        parent = os.getppid()
        grand = watchdog.parent_of(parent)
        print(os.getpid(), flush=True)
        deadline = time.monotonic() + seconds
        if mode == "stop":
            time.sleep(seconds)
        while (os.getppid() == parent and watchdog.parent_of(parent) == grand
               and time.monotonic() < deadline):
            time.sleep(0.05)
        for thread in threading.enumerate():  # under dvc: once the watchdog has spoken
            if thread.name == "wellfed-watchdog":
                thread.join(max(deadline - time.monotonic(), 0.0))
        print("finished, orphaned:", watchdog.orphaned(), flush=True)

    guarded(work, "train")
""")
# dvc as far as the stage can tell: a process that runs the stage's command line through a
# shell, as dvc's `$SHELL -c '<cmd>'`, then waits.
DVC = textwrap.dedent("""
    import subprocess, sys
    shell, env_stage, log, mode, seconds, script = sys.argv[1:7]
    env = dict(__import__("os").environ)
    if env_stage == "no":
        env.pop("DVC_STAGE", None)
    with open(log, "w") as out:
        subprocess.run([shell, "-c", f"{sys.executable} {script} {mode} {seconds}"], env=env,
                       stdout=out, stderr=subprocess.STDOUT)
""")


# A train stage inside run_stoppable: its "workers" finish their step once asked, and only after
# dvc's death has been seen (as on Ray Train, where the stop takes 10 to 24 s).
TRAINING = textwrap.dedent("""
    import os, sys, threading, time
    from wellfed import watchdog
    from wellfed.cli import guarded
    from wellfed.train.checkpoints.preemption import Stopped, run_stoppable

    def work():
        print(os.getpid(), flush=True)
        asked = threading.Event()

        def request():
            print("request", flush=True)
            asked.set()

        def fit():
            asked.wait(120)
            while not watchdog.orphaned():
                time.sleep(0.05)
            time.sleep(0.5)  # the driver looks for the watchdog's request every 0.2 s
        try:
            run_stoppable(fit, request, lambda: 7, 76)
        except Stopped as stop:  # its line is said: as stages/train.py
            sys.exit(stop.exit_code)

    guarded(work, "train")
""")


def start(tmp_path: Path, shell: str, mode: str = "stop", seconds: float = 120,
          under_dvc: bool = True, stage: str = STAGE,
          session: bool = False) -> tuple[subprocess.Popen, Path, int]:
    (tmp_path / "stage.py").write_text(stage)
    log = tmp_path / "stage.log"
    env = {**os.environ, "DVC_STAGE": "train", "PYTHONPATH": str(PROJECT / "src")}
    dvc = subprocess.Popen([sys.executable, "-c", DVC, shell, "yes" if under_dvc else "no",
                            str(log), mode, str(seconds), str(tmp_path / "stage.py")], env=env,
                           start_new_session=session)
    deadline = time.time() + 300  # a hang guard: the stage's imports on a loaded machine
    while not (log.is_file() and log.read_text().strip()):
        assert time.time() < deadline and dvc.poll() is None
        time.sleep(0.05)
    return dvc, log, int(log.read_text().split()[0])


def gone(pid: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("shell", ["/usr/bin/dash", "/usr/bin/bash"])
def test_a_stage_stops_when_dvc_is_killed_alone(tmp_path, shell):
    if not Path(shell).exists():
        pytest.skip(f"no {shell} here")
    dvc, log, stage = start(tmp_path, shell)
    assert psutil.Process(stage).is_running()
    os.kill(dvc.pid, signal.SIGKILL)  # dvc alone: the shell (dash) and the stage stay
    dvc.wait()
    assert gone(stage, timeout=120)  # POLL_S 1 s; SIGTERM then ends it at once
    lines = log.read_text().splitlines()
    assert lines[1] == f"[wellfed] dvc (pid {dvc.pid}) is gone: stopping this stage as on SIGTERM"
    assert lines[2:] in ([], ["Terminated"])  # dash's own word for a child ended by SIGTERM


@pytest.mark.parametrize("shell", ["/usr/bin/dash", "/usr/bin/bash"])
def test_while_training_dvc_killed_alone_asks_for_the_stop_in_process(tmp_path, shell):
    """No signal is sent: the watchdog asks run_stoppable, which stops as on SIGTERM."""
    if not Path(shell).exists():
        pytest.skip(f"no {shell} here")
    dvc, log, stage = start(tmp_path, shell, stage=TRAINING)
    os.kill(dvc.pid, signal.SIGKILL)
    dvc.wait()
    assert gone(stage, timeout=60)
    assert log.read_text().splitlines()[1:] == [
        f"[wellfed] dvc (pid {dvc.pid}) is gone: stopping this stage as on SIGTERM",
        "[wellfed] SIGTERM: finishing the current step and saving a checkpoint (send it again "
        "to stop at once)",
        "request",
        "[wellfed] stopped by SIGTERM at step 7 of 76, checkpoint saved; rerun `dvc repro` (or "
        "resubmit the same sbatch job) to resume from step 7"]


@pytest.mark.parametrize("shell", ["/usr/bin/dash", "/usr/bin/bash"])
def test_sigterm_to_dvcs_group_is_one_request_though_dvc_dies_of_it(tmp_path, shell):
    """The documented SIGTERM, to dvc's process group: dvc dies of it at once and the watchdog
    sees that while the stage stops; the same request (it used to send a second SIGTERM, and
    the stage stopped at once, losing its steps)."""
    if not Path(shell).exists():
        pytest.skip(f"no {shell} here")
    dvc, log, stage = start(tmp_path, shell, stage=TRAINING, session=True)
    os.killpg(dvc.pid, signal.SIGTERM)
    dvc.wait()
    assert gone(stage, timeout=60)
    lines = log.read_text().splitlines()[1:]
    assert lines == [
        "[wellfed] SIGTERM: finishing the current step and saving a checkpoint (send it again "
        "to stop at once)",
        "request",
        f"[wellfed] dvc (pid {dvc.pid}) is gone (it exits at once on SIGTERM): the same "
        "request, the stop goes on",
        "[wellfed] stopped by SIGTERM at step 7 of 76, checkpoint saved; rerun `dvc repro` (or "
        "resubmit the same sbatch job) to resume from step 7"], lines


def test_after_training_the_stage_finishes_and_knows_it_was_orphaned(tmp_path):
    dvc, log, stage = start(tmp_path, "/bin/sh", mode="finish", seconds=300)
    os.kill(dvc.pid, signal.SIGKILL)
    dvc.wait()
    assert gone(stage, timeout=300)
    assert log.read_text().splitlines()[1:] == [
        f"[wellfed] dvc (pid {dvc.pid}) is gone: training is done, so this stage finishes its "
        "outputs; a rerun of `dvc repro` finds them and records them",
        "finished, orphaned: True"]


def test_a_stage_run_by_hand_outlives_a_parent_that_exits(tmp_path):
    dvc, log, stage = start(tmp_path, "/bin/sh", mode="by-hand", seconds=300, under_dvc=False)
    os.kill(dvc.pid, signal.SIGKILL)
    dvc.wait()
    assert gone(stage, timeout=300)
    assert log.read_text().splitlines()[1:] == ["finished, orphaned: False"]


# A driver that starts a "daemon" (a sleep, standing for local Ray's) inside daemons_apart, as
# ray_train.fit_on_ray starts Ray, prints both pids, then waits to be killed.
DRIVER = textwrap.dedent("""
    import os, subprocess, sys, time
    from wellfed.train.checkpoints import daemons
    with daemons.daemons_apart(local=True):
        daemon = subprocess.Popen(["sleep", "300"])
    print(os.getpid(), daemon.pid, flush=True)
    time.sleep(300)
""")


@pytest.mark.parametrize("own_session", [False, True], ids=["in-dvc's-group", "session-leader"])
def test_a_driver_killed_outright_takes_its_daemons_group_with_it(tmp_path, own_session):
    """daemons.daemons_apart's reaper: SIGKILL runs no cleanup in the driver, and Ray's
    agents outlived it by 1.5 to 3 minutes; the reaper, in the daemons' group, ends the group
    within a poll of the driver's death, whether the driver could leave its group or led it."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src")}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], env=env, stdout=subprocess.PIPE,
                              text=True, start_new_session=own_session)
    pid, daemon = map(int, driver.stdout.readline().split())
    assert os.getpgid(daemon) == pid  # the daemons' group is the driver's pid, either way
    reaper = [p for p in psutil.Process(pid).children() if p.pid != daemon]
    assert len(reaper) == 1 and os.getpgid(reaper[0].pid) == pid
    driver.kill()
    driver.wait()
    assert gone(daemon, timeout=120) and gone(reaper[0].pid, timeout=120)
