"""Stop on SIGTERM/SIGINT: the workers finish the step under way, checkpoint it, and stop.

SLURM (`--signal`) and spot machines send SIGTERM some seconds before they kill; Ctrl-C sends
SIGINT. Either reaches the train stage's driver; the work since the last periodic checkpoint
would be lost without this module.

Why the driver tells the workers, rather than the workers catching the signal themselves:
- The signal reaches the driver only. With `dvc repro` it goes to dvc's process group, which
  holds dvc and the driver; Ray starts every worker (and the Train controller) in a process
  group of its own, and on a cluster the workers are on other machines anyway. SLURM's
  `B:` signal reaches the batch shell alone, which forwards it to that group.
- A worker cannot install a Python signal handler: Ray Train runs the training function in a
  thread, and only the main thread may.
- Ray 2.60 Train's own preemption path (`ray.train.get_preemption_info`) is fed by Ray Core
  node *drains* (autoscaler, KubeRay), not by signals; there is no public way to feed it.
So the driver catches the signal (it runs `trainer.fit()` in a thread so that the main thread,
the only one Python delivers signals to, stays free) and resolves a call that every worker
left pending on a tiny `StopFlag` actor: a Ray-native channel that reaches any node, costs no
RPC per step (a worker only checks whether its own pending call has resolved), and fails safe
(if the actor dies, the call resolves with an error, which also reads as "stop").

The workers must stop after the *same* step (DDP: a rank that stops early leaves the others
waiting in an all-reduce), but the flag resolves at slightly different moments on each worker.
So after every step the ranks all-reduce (MAX) one CPU float saying "I have seen it": one
collective, over gloo even when the gradients go over NCCL, so it never syncs the GPU. Measured
on this (busy) 2-core machine: 0.07 ms for the check on the pending call, 0.6 ms for the
all-reduce between 2 ranks, per step.

One local worker trains in the driver's own process (train/run/local.py): there the signal needs
no channel, `run_stoppable` sets a threading.Event that the loop checks after every step, and
the rest is the same.

One stop, however it arrives. The documented SIGTERM goes to `dvc repro`'s process group: it
reaches the stage, and dvc dies of it at once, which the stage's watchdog (wellfed/watchdog.py)
sees within a second, while the workers finish their step. That death is the same request: the
watchdog asks in-process (`watchdog.requests_to`), and a stop already under way goes on. A second
delivery of the same signal within DUPLICATE_S of the first (the group's and one forwarded by a
wrapper or a batch script) is the same request too, said in one line. Only a signal sent again
later stops at once: the driver marks the MLflow run KILLED (KILLED_WAIT_S at most) and exits,
taking Ray with it; the work since the last registered checkpoint is lost.

A stop asked for during the last step comes after it: the final checkpoint is saved and the
stage still stops (128 + the signal), so dvc does not go on to evaluate; the rerun trains
nothing and exports the model from that checkpoint.

Local Ray's daemons start in a process group of their own (train/checkpoints/daemons.py), so
that the SIGTERM meant for the driver does not kill them; a stop at once kills that group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, TypeVar

from wellfed import watchdog
from wellfed.train.checkpoints import daemons

T = TypeVar("T")
SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUPLICATE_S = 2.0
"""The same signal again within this many seconds of the first is the same request: deliveries
to a process group and from a forwarding script land milliseconds apart; a person's second
Ctrl-C, or SLURM's own SIGTERM at the time limit (120 s after the batch script's), comes
later."""
KILLED_WAIT_S = 3.0
"""At most this long, on a stop at once, for MLflow to mark the run KILLED (a local store: tens
of milliseconds; a tracking server that does not answer is not waited for)."""


def said(signum: int) -> str:
    """A signal as a person knows it: `Ctrl-C (SIGINT)`, `SIGTERM`."""
    name = signal.Signals(signum).name
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else name


class Stopped(Exception):
    """Training stopped on a signal; `str()` is the one line the stage prints."""

    def __init__(self, signum: int, step: int | None, total: int, at_once: bool = False):
        self.signum, self.step, self.total, self.at_once = signum, step, total, at_once
        self.exit_code = 128 + signum  # the shell's convention: 143 = SIGTERM, 130 = SIGINT
        name = said(signum)
        how = f"at once by a second {name}" if at_once else f"by {name}"
        resume = ("rerun `dvc repro` (or resubmit the same sbatch job) to resume from step "
                  f"{step}")
        if not step:
            line = f"stopped {how} before the first checkpoint: a rerun starts from step 0"
        elif step >= total and not at_once:
            line = (f"stopped {how} after the last step ({step} of {total}), checkpoint saved; "
                    "rerun `dvc repro` (or resubmit the same sbatch job) to export the model "
                    "from it: no step is trained again")
        elif at_once:
            line = (f"stopped {how}: the steps after the last checkpoint (step {step} of "
                    f"{total}) are lost; {resume}")
        else:
            line = f"stopped {how} at step {step} of {total}, checkpoint saved; {resume}"
        super().__init__(line)


class StopFlag:
    """One per run: workers hold a pending `wait()` call that the driver's `request()` resolves.
    It also keeps the first permanent error a worker hit (`fail`, train/run/worker.py): the workers
    Ray restarts after it read `failure()` and return at once, and the driver raises it."""

    def __init__(self):
        self.requested = asyncio.Event()
        self.failed: str | None = None

    async def fail(self, line: str) -> None:
        self.failed = self.failed or line

    async def failure(self) -> str | None:
        return self.failed

    async def wait(self) -> bool:
        await self.requested.wait()
        return True

    async def request(self) -> None:
        self.requested.set()


def new_stop_flag():
    """The run's `StopFlag` actor (no CPU: it must fit beside the workers on any cluster), on
    the driver's node: a flag on another node would die with it, and a dead flag reads as
    "stop" to every worker (train/run/lost_node.py: the run goes on after a lost node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(num_cpus=0)(StopFlag).options(scheduling_strategy=here).remote()


class StopCheck:
    """Worker side: `check()` is True after the same step on every rank once the driver asked."""

    def __init__(self, flag):
        import torch
        import torch.distributed as dist

        self.pending = flag.wait.remote() if flag is not None else None
        self.dist = dist if dist.is_initialized() and dist.get_world_size() > 1 else None
        # Collective call: every rank creates the group, in the same order (here, at start).
        self.group = (dist.new_group(backend="gloo")
                      if self.dist and dist.get_backend() != "gloo" else None)
        self.seen = torch.zeros(1)

    def check(self) -> bool:
        import ray

        seen = self.pending is not None and bool(ray.wait([self.pending], timeout=0)[0])
        if self.dist is None:
            return seen
        self.seen.fill_(float(seen))
        self.dist.all_reduce(self.seen, op=self.dist.ReduceOp.MAX, group=self.group)
        return bool(self.seen.item())


class _AtOnce(BaseException):
    """Raised in the main thread by a second signal (BaseException: nothing on the way eats it)."""

    def __init__(self, signum: int):
        self.signum = signum


def run_stoppable(fit: Callable[[], T], request: Callable[[], object],
                  checkpoint_step: Callable[[], int | None], total: int,
                  killed: Callable[[], object] | None = None) -> T:
    """Run `fit` (Ray Train's blocking `trainer.fit`, or the in-process loop: train/run/local.py)
    with SIGTERM/SIGINT caught and return its result. A signal, or dvc's death seen by the
    watchdog, calls `request()` once, which asks the workers to stop (the StopFlag actor's
    `request.remote`, or an Event's `set`); the same signal again within DUPLICATE_S, and dvc's
    death at any time, are that same request. After it, say the `Stopped` line and raise it
    once the workers have checkpointed and returned (also when that was the final step: the
    stop still holds).
    After another signal, print the `Stopped` line, call `killed()` (mark the MLflow run
    KILLED; KILLED_WAIT_S at most) and end the process right away, without Ray's orderly
    shutdown: `fit` is still inside `ray.get` in its thread, and tearing Ray down under it ended
    the stage silently in two of the tests' runs. Local Ray's daemons go with it (their agents
    would linger a minute on their own), the workers with the raylet; on a cluster, Ray ends a
    job's actors when its driver goes."""
    box: dict = {}
    first: list = []  # [signum, time.monotonic()] of the request, once made
    gone: list[str] = []  # the watchdog's `dvc (pid …) is gone`, set from its thread

    def target() -> None:
        try:
            box["value"] = fit()
        except BaseException as err:  # handed to the main thread, raised there
            box["error"] = err

    def stop(signum: int, why: str | None = None) -> None:
        if first:  # a signal's handler ran in between (the main thread, between two lines)
            return
        first.extend((signum, time.monotonic()))  # first: a signal landing below is a repeat
        if why:
            print(f"[wellfed] {why}: stopping this stage as on SIGTERM", file=sys.stderr,
                  flush=True)
        # The line first, whole, then the request: a second signal that the request's effects
        # let in cannot cut the line short and glue its own onto it.
        print(f"[wellfed] {said(signum)}: finishing the current step and saving a "
              "checkpoint (send it again to stop at once)", file=sys.stderr, flush=True)
        request()

    def on_signal(signum, frame) -> None:
        if not first:
            stop(signum)
            return
        ago = time.monotonic() - first[1]
        if signum != first[0] or ago >= DUPLICATE_S:
            raise _AtOnce(signum)
        print(f"[wellfed] {said(signum)} again {ago:.1f} s after the first: the same request "
              "(a signal to the process group and a forwarded copy arrive together); the stop "
              f"goes on (send it again after {DUPLICATE_S:.0f} s to stop at once)",
              file=sys.stderr, flush=True)

    def same(why: str) -> None:
        print(f"[wellfed] {why} (it exits at once on {said(first[0])}): the same request, the "
              "stop goes on", file=sys.stderr, flush=True)

    def dvc_gone() -> None:  # in the main thread, as the signals are
        if first:
            same(gone[0])
        else:
            stop(signal.SIGTERM, gone[0])

    # Not the main thread: Ray Train then skips its own SIGINT handler (which aborts the
    # workers without a checkpoint) and the main thread stays free to run ours.
    thread = threading.Thread(target=target, name="wellfed-fit", daemon=True)
    previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    watchdog.requests_to(gone.append)
    try:
        thread.start()
        seen = False
        while thread.is_alive():
            thread.join(0.2)
            if gone and not seen:
                seen = True
                dvc_gone()
    except _AtOnce as again:
        for s in SIGNALS:  # the stop at once is under way: nothing interrupts it now
            signal.signal(s, signal.SIG_IGN)
        stop_now(Stopped(again.signum, checkpoint_step(), total, at_once=True), killed)
    finally:
        # Once stopping, what is left (the line, Ray's shutdown) is the stop itself: dvc going
        # away is still the same request, and a later signal must not kill the stage before it
        # says where it stopped. None: a handler installed outside Python (Ray's own).
        watchdog.requests_to(same if first and not seen else None)
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_IGN if first else
                          handler if handler is not None else signal.SIG_DFL)
    if "error" in box:
        raise box["error"]
    if first:
        # Said here, before Ray's shutdown: it gives SIGTERM its default action back (seen with
        # strace), so a signal then would end the stage before the stage could say it.
        stop = Stopped(first[0], checkpoint_step(), total)
        print(f"[wellfed] {stop}", file=sys.stderr, flush=True)
        raise stop
    return box["value"]


def stop_now(stop: Stopped, killed: Callable[[], object] | None) -> None:
    """End the process at once with `stop`'s line and exit code, the MLflow run marked KILLED
    by `killed()` first (in a thread: KILLED_WAIT_S at most), local Ray's daemons killed."""
    print(f"[wellfed] {stop}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    if killed is not None:
        def mark() -> None:
            with contextlib.suppress(Exception):  # MLflow down: the line above is what counts
                killed()

        marker = threading.Thread(target=mark, name="wellfed-killed", daemon=True)
        marker.start()
        marker.join(KILLED_WAIT_S)
    daemons.kill()
    os._exit(stop.exit_code)
