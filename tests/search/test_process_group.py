"""A search (or a stage) started straight from an interactive shell leads its process group,
and the documented stop signals that group: local Ray's daemons must be outside it
(daemons.daemons_apart), or the signal kills them before the search can stop politely. A
driver killed outright still takes them with it (the reaper, in their group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.e2e.pipeline import PROJECT

# An interactive shell's job: a process leading its own group inside a session it does not
# lead. It spawns a "daemon" under daemons_apart as ray.init would and prints the groups; on
# SIGTERM it says whether the daemon still runs (a moment after the signal) and exits.
DRIVER = """
import os, signal, subprocess, sys, time
if sys.argv[1] == 'shell':
    os.setsid()
    job = subprocess.Popen([sys.executable, '-c', sys.argv[2], 'job'], process_group=0)
    sys.exit(job.wait())
from wellfed.train.checkpoints import daemons
assert os.getpgrp() == os.getpid() != os.getsid(0)
with daemons.daemons_apart(local=True):
    daemon = subprocess.Popen(['sleep', '300'])
def stop(signum, frame):
    time.sleep(0.5)
    print('daemon', 'runs' if daemon.poll() is None else 'died', flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print(os.getpid(), os.getpgrp(), daemon.pid, os.getpgid(daemon.pid), daemons._daemon_group,
      flush=True)
time.sleep(300)
"""


def test_a_driver_leading_its_group_starts_the_daemons_outside_it_and_takes_them_along():
    shell = subprocess.Popen([sys.executable, "-c", DRIVER, "shell", DRIVER],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(PROJECT / "src")})
    try:
        pid, group, daemon, daemons, recorded = map(int, shell.stdout.readline().split())
        assert group == pid  # it leads its own group again, as the shell made it
        assert daemons != group and recorded == daemons  # out of the group signal's reach
        os.killpg(group, signal.SIGTERM)  # the group's stop
        assert shell.stdout.readline().strip() == "daemon runs"  # did not reach the daemon
        shell.wait(timeout=30)
        deadline = time.time() + 30  # the reaper polls each second for its driver
        while gone(daemon) is False and time.time() < deadline:
            time.sleep(0.2)
        assert gone(daemon)  # ended with its driver, by the reaper
    finally:
        shell.kill()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # no init to reap it here
    except psutil.NoSuchProcess:
        return True
