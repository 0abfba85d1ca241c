"""Stopping, without a pipeline: the signal handlers that turn SIGTERM/SIGINT into a checkpoint and
one line (train/checkpoints/preemption.py), the SLURM batch script that forwards SLURM's SIGTERM and
requeues, and the global batches that let a resume change the worker count. The same faults through
`dvc repro` are tests/e2e/test_preemption.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tests.conftest import PROJECT
from tests.e2e.pipeline import env


def test_the_global_batches_do_not_depend_on_the_worker_count():
    """What makes a resume on another worker count continue the same run: step i trains on the
    same rows whatever the world size; only their split over the ranks differs."""
    from wellfed.data.batching import BatchSpec, iterate_steps

    lengths = np.random.default_rng(3).integers(3, 60, size=603)
    plans = {}
    for world in (1, 2, 3):
        spec = BatchSpec(global_batch=16, world_size=world, micro_rows=4, seed=7, pool_batches=4)
        per_rank = [list(iterate_steps(lengths, spec, r, start_epoch=0, start_index=9, epochs=2))
                    for r in range(world)]
        plans[world] = [(s[0].epoch, s[0].index, s[0].global_rows, s[0].real_tokens,
                         sorted(i for rank in s for m in rank.micro for i in m.tolist()))
                        for s in zip(*per_rank)]
    assert len(plans[1]) == 2 * 38 - 9
    assert plans[1] == plans[2] == plans[3]


SENDERS: list[threading.Thread] = []


@pytest.fixture
def handlers():
    """Signals sent to this very process by `send_when_caught`; the handlers restored after,
    once every sender has finished (none may reach a later test), and the watchdog's request
    (wellfed/watchdog.py) taken back."""
    from wellfed import watchdog

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for thread in SENDERS:
        thread.join(timeout=600)
        assert not thread.is_alive(), "a signal sender never saw run_stoppable's handler"
    SENDERS.clear()
    for s, handler in saved.items():
        signal.signal(s, handler)
    watchdog.requests_to(None)


def send_when_caught(*signums: int, gap: float = 0.2) -> None:
    """From a thread: once run_stoppable has installed its handler, send `signums` to this
    process (never before: SIGTERM would end the test run). The handler to wait past is read
    here, before the thread starts: read in a thread started late, it was run_stoppable's own."""
    original = signal.getsignal(signums[0])

    def send():
        while signal.getsignal(signums[0]) is original:
            time.sleep(0.01)
        for signum in signums:
            time.sleep(gap)
            os.kill(os.getpid(), signum)

    thread = threading.Thread(target=send, daemon=True)
    SENDERS.append(thread)
    thread.start()


def test_a_signal_asks_the_workers_to_stop_and_names_their_checkpoint(handlers, capsys):
    from wellfed import watchdog
    from wellfed.train.checkpoints.preemption import Stopped, run_stoppable

    requested = threading.Event()
    send_when_caught(signal.SIGTERM)
    with pytest.raises(Stopped) as stop:  # the "workers" return once asked, checkpoint at 7
        run_stoppable(lambda: requested.wait(300), requested.set, lambda: 7, 76)
    assert requested.is_set() and stop.value.exit_code == 143
    assert str(stop.value) == ("stopped by SIGTERM at step 7 of 76, checkpoint saved; rerun `dvc "
                               "repro` (or resubmit the same sbatch job) to resume from step 7")
    # Stopping is under way: a later signal must not kill the stage before it is done, and dvc
    # going away now (the watchdog) is the same request still.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    capsys.readouterr()
    watchdog._state["request"]("dvc (pid 4821) is gone")
    assert capsys.readouterr().err == ("[wellfed] dvc (pid 4821) is gone (it exits at once on "
                                       "SIGTERM): the same request, the stop goes on\n")


def test_the_same_signal_again_at_once_is_the_same_request_said_in_one_line(handlers, capsys):
    """A signal to dvc's process group and a copy forwarded by a script land together: one
    stop, not "stop at once" (which lost the steps since the last periodic checkpoint)."""
    from wellfed.train.checkpoints.preemption import Stopped, run_stoppable

    asked = []
    done = threading.Event()
    send_when_caught(signal.SIGTERM, signal.SIGTERM, gap=0.05)

    def request():  # the workers return once asked, after the step under way
        asked.append(1)
        threading.Timer(1.0, done.set).start()  # both signals are in by then

    with pytest.raises(Stopped) as stop:
        run_stoppable(lambda: done.wait(300), request, lambda: 7, 76)
    assert len(asked) == 1 and not stop.value.at_once and stop.value.exit_code == 143
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and err[2] == f"[wellfed] {stop.value}", err  # said before Ray stops
    assert err[0] == ("[wellfed] SIGTERM: finishing the current step and saving a checkpoint "
                      "(send it again to stop at once)")
    assert err[1].startswith("[wellfed] SIGTERM again 0.")
    assert err[1].endswith(" s after the first: the same request (a signal to the process group "
                           "and a forwarded copy arrive together); the stop goes on (send it "
                           "again after 2 s to stop at once)")


def test_dvc_gone_while_stopping_is_the_same_request(handlers, capsys):
    """The watchdog's in-process request (wellfed/watchdog.py), as when dvc dies of the SIGTERM
    sent to its group: no second signal, one line, the stop goes on."""
    from wellfed import watchdog
    from wellfed.train.checkpoints.preemption import Stopped, run_stoppable

    asked = []
    done = threading.Event()
    send_when_caught(signal.SIGTERM)

    def request():  # then dvc is seen gone, as the watchdog's thread calls it
        asked.append(1)
        threading.Thread(target=gone_then_done).start()

    def gone_then_done():
        watchdog._state["request"]("dvc (pid 4821) is gone")
        time.sleep(0.5)  # the main thread looks every 0.2 s
        done.set()

    with pytest.raises(Stopped) as stop:
        run_stoppable(lambda: done.wait(300), request, lambda: 9, 76)
    assert asked == [1] and str(stop.value).startswith("stopped by SIGTERM at step 9 of 76")
    assert capsys.readouterr().err.splitlines()[1:] == [
        "[wellfed] dvc (pid 4821) is gone (it exits at once on SIGTERM): the same request, the "
        "stop goes on", f"[wellfed] {stop.value}"]
    assert watchdog._state["request"] is None  # dvc was seen gone: there is nothing to watch


def test_dvc_gone_alone_stops_as_on_sigterm(handlers, capsys):
    from wellfed import watchdog
    from wellfed.train.checkpoints.preemption import Stopped, run_stoppable

    requested = threading.Event()

    def fit():
        while watchdog._state["request"] is None:
            time.sleep(0.01)
        watchdog._state["request"]("dvc (pid 4821) is gone")
        requested.wait(300)

    with pytest.raises(Stopped) as stop:
        run_stoppable(fit, requested.set, lambda: 12, 76)
    assert stop.value.exit_code == 143 and not stop.value.at_once
    assert capsys.readouterr().err.splitlines() == [
        "[wellfed] dvc (pid 4821) is gone: stopping this stage as on SIGTERM",
        "[wellfed] SIGTERM: finishing the current step and saving a checkpoint (send it again "
        "to stop at once)", f"[wellfed] {stop.value}"]


AT_ONCE = """
import os, signal, sys, threading, time
from wellfed.train.checkpoints import preemption

preemption.DUPLICATE_S = 0.2  # the test's own: the second signal comes after it
preemption.KILLED_WAIT_S = 1.0
first, second, mark = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
# A test runner may start this process with the signals ignored (pytest-xdist's workers hand
# SIGINT on as SIG_IGN, and Python then installs no handler of its own): the defaults first, so
# the wait below sees when run_stoppable's handlers are in.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)

handled = threading.Event()

def send():  # once the handlers are in, the first; once it was handled, past the window, the second
    while signal.getsignal(first) in (signal.default_int_handler, signal.SIG_DFL):
        time.sleep(0.01)
    os.kill(os.getpid(), first)
    handled.wait()  # counted, not a gap: the first's handler asked for the stop
    time.sleep(preemption.DUPLICATE_S + 0.1)  # measured from the handling: past the window
    os.kill(os.getpid(), second)

def killed():  # MLflow's set_terminated, here a file; "hang": a server that does not answer
    if mark == "hang":
        time.sleep(60)
    open(mark, "w").write("KILLED")

threading.Thread(target=send, daemon=True).start()
preemption.run_stoppable(threading.Event().wait, handled.set, lambda: 20, 76,  # never returns
                         killed=killed)
print("not reached")
"""


def at_once(first: int, second: int, mark: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", AT_ONCE, str(first), str(second), mark],
                          capture_output=True, text=True, timeout=600, env=env())


def test_a_signal_sent_again_later_ends_the_stage_at_once_marking_the_run_killed(tmp_path):
    mark = tmp_path / "status"
    proc = at_once(signal.SIGINT, signal.SIGINT, str(mark))
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "[wellfed] stopped at once by a second Ctrl-C (SIGINT): the steps after the last "
        "checkpoint (step 20 of 76) are lost; rerun `dvc repro` (or resubmit the same sbatch "
        "job) to resume from step 20")
    assert "not reached" not in proc.stdout
    assert mark.read_text() == "KILLED"  # the MLflow run is not left RUNNING


def test_another_signal_is_never_the_same_request_and_a_hung_tracker_is_not_waited_for():
    """SIGTERM then Ctrl-C, even within the window: a person asked; MLflow that does not answer
    holds the exit back KILLED_WAIT_S at most (the process ends: the "hang" never returns)."""
    proc = at_once(signal.SIGTERM, signal.SIGINT, "hang")
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(
        "[wellfed] stopped at once by a second Ctrl-C (SIGINT): the steps after the last "
        "checkpoint (step 20 of 76) are lost")


def test_a_signal_during_the_last_step_still_stops_after_it(handlers):
    """The stop is honoured: the final checkpoint exists, and the stage stops (128 + signal),
    so dvc does not go on to evaluate; the rerun exports the model from that checkpoint."""
    from wellfed.train.checkpoints.preemption import Stopped, run_stoppable

    requested = threading.Event()
    send_when_caught(signal.SIGINT)
    with pytest.raises(Stopped) as stop:
        run_stoppable(lambda: requested.wait(300) and "done", requested.set, lambda: 76, 76)
    assert stop.value.exit_code == 130
    assert str(stop.value) == (
        "stopped by Ctrl-C (SIGINT) after the last step (76 of 76), checkpoint saved; rerun "
        "`dvc repro` (or resubmit the same sbatch job) to export the model from it: no step is "
        "trained again")


def test_without_a_signal_the_handlers_are_given_back(handlers):
    from wellfed.train.checkpoints.preemption import run_stoppable

    before = signal.getsignal(signal.SIGINT)
    assert run_stoppable(lambda: 42, threading.Event().set, lambda: None, 76) == 42
    assert signal.getsignal(signal.SIGINT) is before


STUBS = {  # what the sbatch script calls, minus SLURM and Ray: each logs what it was asked
    "scontrol": """case "$1" in
  show) echo node1 ;;
  requeue) echo "scontrol requeue $2" >>"$STUB_LOG" ;;
esac""",
    "srun": """case "$*" in
  *hostname*) echo 127.0.0.1 ;;
  *--block*) echo $$ >>"$STUB_DIR/blocking"; exec sleep 300 ;;  # a Ray node, until ray stop
  *"ray stop"*) echo "ray stop" >>"$STUB_LOG"; xargs kill <"$STUB_DIR/blocking" ;;
esac""",
    "ray": "exit 0",  # ray status: the head is up
    "python": "echo 1",  # the script's probe: nodes alive
    # dvc dies of SIGTERM at once; its train stage (same process group) takes a while to
    # checkpoint, then exits 143, as the real ones do.
    "dvc": """checkpoint() { echo "stage: SIGTERM" >>"$STUB_LOG"; sleep 2
  echo "stage: checkpointed" >>"$STUB_LOG"; exit 143; }
(trap checkpoint TERM; echo "stage: training" >>"$STUB_LOG"; while true; do sleep 0.1; done) &
wait""",
}


@pytest.mark.integration
def test_the_sbatch_script_forwards_slurms_sigterm_waits_for_the_checkpoint_and_requeues(tmp_path):
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    bin_dir.mkdir()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "log"
    log.touch()
    job_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log),
               "STUB_DIR": str(tmp_path), "SLURM_SUBMIT_DIR": str(tmp_path), "VENV": str(venv),
               "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "42"}
    job = subprocess.Popen(["bash", str(PROJECT / "scripts" / "slurm" / "wellfed.sbatch")],
                           env=job_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300  # a hang guard, long enough for a loaded machine
    while "stage: training" not in log.read_text():
        assert time.time() < deadline and job.poll() is None, job.stdout.read()
        time.sleep(0.1)
    job.send_signal(signal.SIGTERM)  # `--signal=B:TERM@120`: the batch shell alone
    out, _ = job.communicate(timeout=600)
    assert job.returncode == 0, out
    assert log.read_text().splitlines() == ["stage: training", "stage: SIGTERM",
                                            "stage: checkpointed", "scontrol requeue 42",
                                            "ray stop"], out
    assert "requeueing job 42" in out
