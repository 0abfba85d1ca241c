"""Preemption, for real: SIGTERM/SIGINT sent to `dvc repro`'s process group mid-training (as
SLURM's batch script and a terminal's Ctrl-C send them), with periodic checkpoints far apart so
that only the checkpoint written on the signal can save the work; then the rerun, on the same or
a different number of workers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.pipeline import env, make_project, mlflow_runs, run
from tests.e2e.test_cluster import command_line, fresh, loss_steps, set_params
from wellfed.train.checkpoints.preemption import DUPLICATE_S

STEPS = 2 * 38  # 600 rows / global batch 16 = 38 steps per epoch, 2 epochs
REPORT_EVERY = 5
SHORT = 40  # max_steps where a test's rerun trains one row per micro-batch (16 per step)
STOPPED = re.compile(r"^\[wellfed\] stopped by (SIGTERM|Ctrl-C \(SIGINT\)) at step (\d+) of "
                     r"(\d+), checkpoint saved; rerun `dvc repro` \(or resubmit the same sbatch "
                     r"job\) to resume from step (\d+)$")


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_model_dir):
    """A tokenized project copy (tiny random BERT, 2 workers) whose periodic checkpoint never
    comes: checkpoint_every is past the last step."""
    dest = tmp_path_factory.mktemp("preempt")
    make_project(dest, {"model": {"name": str(tiny_model_dir), "init": "random"},
                        "train": {"epochs": 2, "lr": 2e-3, "global_batch_size": 16,
                                  "micro_batch_size": 8, "report_every": REPORT_EVERY,
                                  "checkpoint_every": 1000, "eval_every": 0},
                        "ray": {"num_workers": 2, "cpus_per_worker": 1}})
    run(["dvc", "repro", "tokenize"], dest)
    return dest


def start_repro(project: Path) -> subprocess.Popen:
    """`dvc repro` leading a process group of its own, as a terminal or sbatch runs it."""
    return subprocess.Popen(["dvc", "repro"], cwd=project, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def logged_steps(project: Path) -> list[int]:
    # Not before the stage has set up the MLflow store: a client opening a new sqlite store
    # creates its tables, racing the stage doing the same. The run file is written after.
    if not list((project / "data" / "checkpoints").glob("wf-*/wellfed_run.json")):
        return []
    try:
        return loss_steps(project)
    except Exception:  # no step logged yet
        return []


def wait_for_logged_step(project: Path, proc: subprocess.Popen, step: int,
                         timeout: float = 400) -> int:
    """Until MLflow holds train/loss at `step` or later (workers are at least that far)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        steps = logged_steps(project)
        if steps and max(steps) >= step:
            return max(steps)
        assert proc.poll() is None, f"dvc repro ended early:\n{proc.stdout.read()[-3000:]}"
        time.sleep(0.3)
    raise AssertionError(f"step {step} was never logged")


def signal_group(proc: subprocess.Popen, signum: int) -> str:
    """Send `signum` to dvc repro's process group; return everything the run printed (dvc's
    stdout pipe stays open until the last process writing to it, the train stage, has exited)."""
    os.killpg(proc.pid, signum)
    out, _ = proc.communicate(timeout=300)
    deadline = time.time() + 30
    while group(proc.pid) and time.time() < deadline:
        time.sleep(0.5)
    assert not group(proc.pid), group(proc.pid)  # nothing of the run is left behind
    return out


def group(pgid: int) -> list[str]:
    """The live (not zombie) processes of a process group."""
    alive = []
    for p in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(" ".join(p.info["cmdline"] or []))
        except (ProcessLookupError, psutil.Error):
            pass
    return alive


def stopped_line(out: str, signame: str, steps: int = STEPS) -> int:
    lines = [line for line in out.splitlines() if line.startswith("[wellfed] stopped")]
    assert len(lines) == 1, out[-4000:]
    match = STOPPED.match(lines[0])
    assert match and match[1] == signame and match[2] == match[4], lines[0]
    assert int(match[3]) == steps, lines[0]
    return int(match[2])


# `dvc repro` in a session of its own (so it leads its process group, as under a terminal or the
# sbatch script), under a parent that reaps it and every process of the run that outlives it (a
# child subreaper, prctl PR_SET_CHILD_SUBREAPER = 36): dvc dies of SIGTERM at once, and the train
# stage's own exit status is wanted too. Prints dvc's pid, then writes {pid: exit status} of
# everything it reaped into argv[1].
LAUNCHER = """
import ctypes, json, os, subprocess, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
dvc = subprocess.Popen(sys.argv[2:], start_new_session=True)
print(dvc.pid, flush=True)
codes = {}
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    codes[pid] = os.waitstatus_to_exitcode(status)
with open(sys.argv[1], "w") as f:
    json.dump(codes, f)
"""


def train_stage(root: int) -> psutil.Process:
    """The python process running stages/train.py under `root` (not dvc's `sh -c` around it,
    nor a child between its fork and exec: the topmost one)."""
    found = {}
    for p in psutil.Process(root).children(recursive=True):
        try:
            if p.cmdline()[1:2] == ["stages/train.py"]:
                found[p.pid] = (p, p.ppid())
        except psutil.Error:  # gone while being read
            pass
    (stage,) = [p for p, parent in found.values() if parent not in found]
    return stage


def checkpointed_step(project: Path) -> int:
    """The step in the one checkpoint directory of the run (checkpoint_every is never reached)."""
    dirs = [d for d in (project / "data" / "checkpoints").glob("wf-*/*/checkpoint_*") if d.is_dir()]
    assert len(dirs) == 1, dirs
    return json.loads((dirs[0] / "train_state.json").read_text())["step"]


def resumed(out: str, total: int = STEPS) -> tuple[str, int]:
    """The driver's `resuming interrupted run` line, and the step rank 0 says it resumes from."""
    lines = [line for line in out.splitlines() if "[wellfed] resuming interrupted run" in line]
    steps = [line for line in out.splitlines() if "[wellfed] resuming from step " in line]
    assert len(lines) == 1 and len(steps) == 1, out[-4000:]
    assert f" of {total} " in steps[0], steps[0]
    return lines[0], int(steps[0].split("resuming from step ")[1].split()[0])


@pytest.mark.e2e
def test_sigterm_in_process_saves_the_step_under_way_and_a_rerun_on_ray_resumes_from_it(
        base, tmp_path):
    """One worker trains in the stage's own process (ray.in_process: auto); the rerun on two
    Ray Train workers resumes from its checkpoint, which Ray finds in its own layout."""
    project = fresh(base, tmp_path, ray={"num_workers": 1})
    proc = start_repro(project)
    before = wait_for_logged_step(project, proc, 15)
    sent = time.time()
    out = signal_group(proc, signal.SIGTERM)
    seconds = time.time() - sent
    assert proc.returncode != 0  # dvc dies of the SIGTERM (the stage's own exit status, 128 +
    # the signal, shows through dvc with SIGINT, below)
    step = stopped_line(out, "SIGTERM")
    print(f"\nSIGTERM when MLflow had step {before}: stopped at step {step}, stage gone "
          f"{seconds:.1f} s after the signal")
    # Nothing the worker had done is lost: the checkpoint holds at least every step already
    # logged, and it stopped at a step boundary soon after the signal. It can be a report
    # interval ahead of MLflow (the steps since the last report), and it keeps stepping while
    # this test reads MLflow and sends the signal (the tiny model takes tens of ms a step: one
    # run here went from step 30 logged to a stop at 36); the bound of the Ray path allows both.
    assert before <= step <= before + 3 * REPORT_EVERY + 1
    assert checkpointed_step(project) == step
    assert logged_steps(project) == list(range(1, step + 1))
    _, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "KILLED"
    assert runs[0].data.tags["derived.engine"] == "in_process"
    assert not (project / "data" / "model").exists()

    set_params(project, ray={"num_workers": 2})
    again = run(["dvc", "repro"], project, timeout=600)
    line, resumed_at = resumed(again.stdout + again.stderr)
    assert resumed_at == step
    assert line.endswith(", now on 2 worker(s) instead of 1: the same global batch, 1 "
                         "micro-batch(es) per worker per step"), line
    assert logged_steps(project) == list(range(1, STEPS + 1))  # once each: nothing redone
    _, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    metrics = json.loads((project / "data" / "train" / "metrics.json").read_text())
    assert metrics["train/rows"] == 2 * 600  # every row once per epoch
    assert (project / "data" / "eval" / "metrics.json").is_file()


@pytest.mark.e2e
def test_ctrl_c_on_two_workers_then_the_rerun_on_one_worker_finishes_the_same_run(base, tmp_path):
    """Ray Train's checkpoint, resumed in-process (one worker: ray.in_process auto)."""
    project = fresh(base, tmp_path)
    proc = start_repro(project)
    wait_for_logged_step(project, proc, 10)
    out = signal_group(proc, signal.SIGINT)  # what a terminal's Ctrl-C sends
    step = stopped_line(out, "Ctrl-C (SIGINT)")
    # dvc ignores SIGINT while a stage runs, then reports the exit status of the shell it ran
    # the stage in ($SHELL, else /bin/sh): bash execs the stage, so dvc sees the stage's own
    # 130 (128 + 2); dash waits for it and dies of the SIGINT itself (-2) while the stage goes
    # on to checkpoint and print its line. CI has no $SHELL, so dash.
    assert proc.returncode != 0, out[-3000:]
    assert re.search(r"exited with (130|-2)\b", out), out[-3000:]
    ours = [line for line in out.splitlines() if not line.startswith("\x1b[36m(")]  # not Ray's
    assert not [line for line in ours if "Traceback" in line], out[-4000:]
    _, runs = mlflow_runs(project)
    run_id = runs[0].info.run_id

    set_params(project, ray={"num_workers": 1})
    again = run(["dvc", "repro"], project, timeout=600)
    line, resumed_at = resumed(again.stdout + again.stderr)
    assert "[wellfed] in process: 1 worker on " in again.stdout + again.stderr
    assert resumed_at == step
    assert line.endswith(", now on 1 worker(s) instead of 2: the same global batch, 2 "
                         "micro-batch(es) per worker per step"), line
    _, runs = mlflow_runs(project)
    assert [r.info.run_id for r in runs] == [run_id]  # the same MLflow run
    assert logged_steps(project) == list(range(1, STEPS + 1))  # the same optimizer steps, once
    assert runs[0].data.tags["derived.world_sizes"] == "2,1"
    metrics = json.loads((project / "data" / "train" / "metrics.json").read_text())
    assert metrics["train/rows"] == 2 * 600  # every row once per epoch: the same global batches


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [1, 2], ids=["in_process", "ray_train"])
def test_one_sigterm_to_the_group_finishes_the_step_though_dvc_dies_of_it(base, tmp_path,
                                                                           workers):
    """The documented SIGTERM (to `dvc repro`'s process group): dvc dies of it at once, so the
    stage's watchdog sees dvc gone while the stage finishes its step. That is the same request,
    not a second signal: the checkpoint is of the step under way (no periodic one comes), the
    stage exits 143 with the documented line, the MLflow run is KILLED, and the rerun resumes
    from that step into the same run. (The watchdog used to send a second SIGTERM, read as
    "stop at once": the steps were lost and the MLflow run left RUNNING.)"""
    # One row per micro-batch: a step takes long enough for dvc's death to be seen during it;
    # SHORT steps: the rerun's steps at one row each took 2 of this test's 3 minutes on Ray.
    project = fresh(base, tmp_path, ray={"num_workers": workers},
                    train={"micro_batch_size": 1, "max_steps": SHORT})
    codes = tmp_path / "codes.json"
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(codes), "dvc", "repro"],
                            cwd=project, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    dvc = int(proc.stdout.readline())
    lines, stage, shown = [], None, 0
    for line in proc.stdout:  # the first progress line: training is under way
        lines.append(line)
        if "[wellfed] step " in line:  # on Ray from the Train controller, behind its prefix
            shown = int(line.split("[wellfed] step ")[1].split("/")[0])
            stage = train_stage(dvc)
            os.killpg(dvc, signal.SIGTERM)
            sent = time.time()
            break
    out = "".join(lines) + proc.communicate(timeout=300)[0]  # closes once all of it is gone
    seconds = time.time() - sent
    assert stage is not None, out[-3000:]
    exits = {int(pid): code for pid, code in json.loads(codes.read_text()).items()}
    assert exits[dvc] == -signal.SIGTERM and exits[stage.pid] == 143, (exits, out[-3000:])
    step = stopped_line(out, "SIGTERM", SHORT)
    gone = [line for line in out.splitlines() if f"[wellfed] dvc (pid {dvc}) is gone" in line]
    # In process the stop can be over before the watchdog's next look (1 s): then no line.
    assert len(gone) <= 1 and all("the same request" in g for g in gone), out[-3000:]
    assert shown <= step < SHORT
    assert checkpointed_step(project) == step  # the step under way, not a periodic one
    _, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "KILLED"
    print(f"\nSIGTERM to the group at step {shown} shown: checkpoint at step {step}, stage exit "
          f"{exits[stage.pid]} (all of the run gone {seconds:.1f} s after the signal), dvc "
          f"{exits[dvc]}, MLflow run {runs[0].info.status}; dvc's death "
          f"{'seen' if gone else 'not seen'} by the watchdog")
    print("\n".join(line for line in out.splitlines()
                    if line.startswith(("[wellfed] SIGTERM", "[wellfed] dvc",
                                        "[wellfed] stopped"))))

    again = run(["dvc", "repro", "train"], project, timeout=600)
    _, resumed_at = resumed(again.stdout + again.stderr, SHORT)
    assert resumed_at == step
    assert logged_steps(project) == list(range(1, SHORT + 1))  # once each: nothing redone
    _, after = mlflow_runs(project)
    assert [r.info.run_id for r in after] == [runs[0].info.run_id]
    assert after[0].info.status == "FINISHED"
    if workers == 2:  # exact on Ray Train too: every loss the uninterrupted run logs
        whole = fresh(base, tmp_path / "whole", ray={"num_workers": workers},
                      train={"micro_batch_size": 1, "max_steps": SHORT})
        run(["dvc", "repro", "train"], whole, timeout=600)
        assert losses(project) == losses(whole), (losses(project), losses(whole))


def losses(project: Path) -> list[tuple[int, float]]:
    """The run's train/loss by step, as MLflow holds it."""
    client, runs = mlflow_runs(project)
    return sorted((m.step, m.value) for m in
                  client.get_metric_history(runs[0].info.run_id, "train/loss"))


@pytest.mark.e2e
def test_ctrl_c_during_the_last_step_stops_after_it_and_the_rerun_only_exports(base, tmp_path):
    """A stop asked for in the last step is honoured, not dropped: the final checkpoint is saved
    and the stage exits 130, so dvc does not go on to evaluate (it used to complete the stage
    and run evaluate); the rerun trains nothing, exports from that checkpoint and goes on."""
    # One step, of 64 micro-batches: the model's line (printed as the loop loads it) comes
    # before it, so a signal sent at that line lands in the last step.
    project = fresh(base, tmp_path, ray={"num_workers": 1},
                    train={"max_steps": 1, "global_batch_size": 64, "micro_batch_size": 1})
    proc = start_repro(project)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[wellfed] model: ") and " parameters train (" in line:
            os.killpg(proc.pid, signal.SIGINT)
            break
    out = "".join(lines) + proc.communicate(timeout=300)[0]
    stopped = [line for line in out.splitlines() if line.startswith("[wellfed] stopped")]
    assert stopped == [
        "[wellfed] stopped by Ctrl-C (SIGINT) after the last step (1 of 1), checkpoint saved; "
        "rerun `dvc repro` (or resubmit the same sbatch job) to export the model from it: no "
        "step is trained again"], out[-3000:]
    assert proc.returncode != 0 and re.search(r"exited with (130|-2)\b", out), out[-3000:]
    assert "Running stage 'evaluate'" not in out and not (project / "data" / "model").exists()
    assert checkpointed_step(project) == 1
    _, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "KILLED"

    again = run(["dvc", "repro"], project, timeout=600)
    text = again.stdout + again.stderr
    assert "[wellfed] resuming from step 1 of 1 " in text and "[wellfed] step " not in text
    assert "Running stage 'evaluate'" in text
    assert (project / "data" / "eval" / "metrics.json").is_file()
    assert logged_steps(project) == [1]
    _, after = mlflow_runs(project)
    assert [r.info.run_id for r in after] == [runs[0].info.run_id]
    assert after[0].info.status == "FINISHED"


@pytest.mark.e2e
def test_a_second_signal_stops_at_once_keeping_the_last_checkpoint(base, tmp_path):
    project = fresh(base, tmp_path)
    proc = start_repro(project)
    wait_for_logged_step(project, proc, 5)
    tree = psutil.Process(proc.pid).children(recursive=True)  # the stage, Ray's daemons, workers
    workers = [p for p in tree if "RayTrainWorker" in command_line(p)]
    assert len(workers) == 2, [command_line(p) for p in tree]
    os.killpg(proc.pid, signal.SIGTERM)
    # The first asks for a checkpoint. The workers are held in their step (as a big model's step
    # holds them: the tiny one's stop is over in a second), and the second signal, sent again after
    # the window in which it would be a copy of the first (train/checkpoints/preemption.py), must
    # not wait for them.
    for worker in workers:
        worker.suspend()
    try:
        time.sleep(DUPLICATE_S + 0.5)
        sent = time.time()
        out = signal_group(proc, signal.SIGTERM)
        seconds = time.time() - sent
    finally:
        for worker in workers:  # they then see their raylet gone, and go
            with contextlib.suppress(psutil.Error):
                worker.resume()
    # Ray goes with the driver, though in process groups of its own: its daemons at once, the
    # workers with the raylet.
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, alive
    print(f"\nsecond SIGTERM: stage gone {seconds:.1f} s later, all of Ray "
          f"{time.time() - sent:.0f} s later")
    lines = [line for line in out.splitlines() if line.startswith("[wellfed] stopped")]
    assert len(lines) == 1, out[-4000:]
    # The workers may or may not have registered the checkpoint asked for by the first signal.
    match = re.match(r"^\[wellfed\] stopped at once by a second SIGTERM(?: before the first "
                     r"checkpoint: a rerun starts from step 0|: the steps after the last "
                     r"checkpoint \(step (\d+) of 76\) are lost; rerun `dvc repro`)", lines[0])
    assert match, lines[0]
    if match[1]:
        assert checkpointed_step(project) == int(match[1])
    _, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "KILLED"  # not left RUNNING
    assert seconds < 15  # at once: no step finished, no Ray shutdown waited for


@pytest.mark.e2e
def test_dvc_killed_alone_stops_its_train_stage_at_a_checkpoint_and_the_rerun_resumes(
        base, tmp_path):
    """SIGTERM to dvc's pid only (not its group): dvc exits at once; the stage notices within a
    second (wellfed/watchdog.py), checkpoints and stops as on its own SIGTERM, instead of
    training on to a model version no dvc.lock records. The rerun resumes it: one MLflow run,
    every step once."""
    # One row per micro-batch (16 per step): the 76 steps take seconds, not one, so the signal
    # comes while training (the tiny model ran all 76 in ~1 s at 16 rows per micro-batch).
    project = fresh(base, tmp_path, ray={"num_workers": 1}, train={"micro_batch_size": 1})
    proc = start_repro(project)
    lines = []
    for line in proc.stdout:  # the first progress line: training is under way
        lines.append(line)
        if line.startswith("[wellfed] step "):
            proc.send_signal(signal.SIGTERM)
            break
    out = "".join(lines) + proc.communicate(timeout=300)[0]  # closes when the stage exits
    gone = [line for line in out.splitlines() if "is gone: stopping this stage" in line]
    assert len(gone) == 1 and gone[0].startswith(f"[wellfed] dvc (pid {proc.pid}) is gone"), \
        out[-3000:]
    step = stopped_line(out, "SIGTERM")
    assert checkpointed_step(project) == step and step < STEPS
    _, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "KILLED"
    again = run(["dvc", "repro"], project, timeout=600)
    _, resumed_at = resumed(again.stdout + again.stderr)
    assert resumed_at == step
    assert logged_steps(project) == list(range(1, STEPS + 1))
    client, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    versions = client.search_model_versions("name='wellfed-classifier'")
    assert [str(v.version) for v in versions] == ["1"]  # one version for one recipe


@pytest.mark.e2e
def test_a_train_stage_that_finished_after_dvc_died_is_found_by_the_rerun(base, tmp_path):
    """dvc killed (SIGKILL, its pid only) once training is over: the stage finishes its outputs
    (seconds) and records the completion as orphaned; the rerun's train stage finds them in
    place and trains nothing (dvc records them), and evaluate runs: one MLflow run, one model
    version, where the rerun used to train again from step 0 into a second run."""
    project = fresh(base, tmp_path, ray={"num_workers": 1})
    proc = start_repro(project)
    lines = []
    for line in proc.stdout:  # until training is over: the model line comes right after
        lines.append(line)
        if line.startswith("[wellfed] model: step "):
            os.kill(proc.pid, signal.SIGKILL)
            break
    out = "".join(lines) + proc.stdout.read()  # the stage writes on until it has exited
    proc.wait(timeout=60)
    assert f"[wellfed] dvc (pid {proc.pid}) is gone: training is done, so this stage finishes " \
           "its outputs" in out, out[-3000:]
    assert "[wellfed] train done: " in out and (project / "data" / "train" / "run.json").is_file()
    again = run(["dvc", "repro"], project, timeout=600)
    text = again.stdout + again.stderr
    found = [line for line in text.splitlines() if "already completed with these inputs" in line]
    assert len(found) == 1 and "models:/wellfed-classifier/1" in found[0], text[-3000:]
    assert "[wellfed] step " not in text and "Running stage 'evaluate'" in text
    client, runs = mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    versions = client.search_model_versions("name='wellfed-classifier'")
    assert [str(v.version) for v in versions] == ["1"]  # one version for one recipe
    assert "Data and pipelines are up to date" in run(["dvc", "status"], project).stdout
