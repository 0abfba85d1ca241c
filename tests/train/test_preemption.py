"""Stopping, without a pipeline: the signal handlers that turn SIGTERM/SIGINT into a checkpoint
and one line (train/preemption.py), the SLURM batch script that forwards SLURM's SIGTERM and
requeues, and the global batches that let a resume change the worker count. The same faults
through `dvc repro` are tests/e2e/test_preemption.py."""

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
    once every sender has finished (none may reach a later test)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for thread in SENDERS:
        thread.join(timeout=600)
        assert not thread.is_alive(), "a signal sender never saw run_stoppable's handler"
    SENDERS.clear()
    for s, handler in saved.items():
        signal.signal(s, handler)


def send_when_caught(signum: int) -> None:
    """From a thread: once run_stoppable has installed its handler, send `signum` to this
    process (never before: SIGTERM would end the test run). The handler to wait past is read
    here, before the thread starts: read in a thread started late, it was run_stoppable's own."""
    original = signal.getsignal(signum)

    def send():
        while signal.getsignal(signum) is original:
            time.sleep(0.01)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=send, daemon=True)
    SENDERS.append(thread)
    thread.start()


def test_a_signal_asks_the_workers_to_stop_and_names_their_checkpoint(handlers):
    from wellfed.train.preemption import Stopped, run_stoppable

    requested = threading.Event()
    send_when_caught(signal.SIGTERM)
    with pytest.raises(Stopped) as stop:  # the "workers" return once asked, checkpoint at 7
        run_stoppable(lambda: requested.wait(300), requested.set, lambda: 7, 76)
    assert requested.is_set() and stop.value.exit_code == 143
    assert str(stop.value) == ("stopped by SIGTERM at step 7 of 76, checkpoint saved; rerun `dvc "
                               "repro` (or resubmit the same sbatch job) to resume from step 7")
    # Stopping is under way: a later signal must not kill the stage before it prints that line.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


AT_ONCE = """
import os, signal, threading
from wellfed.train.preemption import run_stoppable

first = threading.Event()

def send():  # once the handlers are in, a Ctrl-C; once it was handled, another
    while signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        first.wait(0.01)
    os.kill(os.getpid(), signal.SIGINT)
    first.wait()  # two signals before the handler ran would reach Python as one
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=send, daemon=True).start()
run_stoppable(threading.Event().wait, first.set, lambda: 20, 76)  # workers that never finish
print("not reached")
"""


def test_a_second_signal_ends_the_stage_at_once_naming_the_last_checkpoint():
    """The workers never return, so the stage ends only by the second signal's path; the
    second signal goes once the first was handled (counted, not a gap in seconds)."""
    proc = subprocess.run([sys.executable, "-c", AT_ONCE], capture_output=True, text=True,
                          timeout=600, env=env())
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "[wellfed] stopped at once by a second Ctrl-C (SIGINT): the steps after the last "
        "checkpoint (step 20 of 76) are lost; rerun `dvc repro` (or resubmit the same sbatch "
        "job) to resume from step 20")
    assert "not reached" not in proc.stdout


def test_a_signal_during_the_last_step_lets_the_run_finish(handlers):
    from wellfed.train.preemption import run_stoppable

    requested = threading.Event()
    send_when_caught(signal.SIGTERM)
    result = run_stoppable(lambda: requested.wait(300) and "done", requested.set,
                           lambda: 76, 76)
    assert result == "done"  # the final checkpoint exists: the stage goes on to export it


def test_without_a_signal_the_handlers_are_given_back(handlers):
    from wellfed.train.preemption import run_stoppable

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
