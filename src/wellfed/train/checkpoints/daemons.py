"""Local Ray's daemons in a process group of their own, so that a stop meant for the driver
does not kill them.

Local Ray's daemons (GCS, raylet, ...) are children of the driver and would stay in dvc's
process group, so the SIGTERM meant for the driver (train/checkpoints/preemption.py) would kill
them, and with them the workers, before any checkpoint. `daemons_apart` starts them in a
process group of their own (the GCS and raylet still die with the driver: Ray ties them to it
with PR_SET_PDEATHSIG; a reaper in their group ends the rest, Ray's agents, within a second of
a driver killed outright). A stop at once (`kill`) ends that group with the driver.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

_daemon_group: int | None = None  # local Ray's daemons' process group (daemons_apart)


def kill() -> None:
    """SIGKILL to local Ray's daemons' group, where this process started one."""
    if _daemon_group:
        with contextlib.suppress(OSError):
            os.killpg(_daemon_group, signal.SIGKILL)


# Runs beside local Ray's daemons, in their process group (whose id is the driver's pid, or the
# reaper's own where the driver leads its group): once the driver is gone (its child
# re-parented), the group goes too, this reaper with it.
REAPER = ("import os, signal, sys, time\n"
          "driver = int(sys.argv[1])\n"
          "while os.getppid() == driver:\n"
          "    time.sleep(1)\n"
          "os.killpg(os.getpgrp(), signal.SIGKILL)\n")


@contextlib.contextmanager
def daemons_apart(local: bool = True):
    """Start local Ray's daemons in a process group of their own (see the module docstring):
    the driver leaves its group while `ray.init` spawns them, then returns to it; the daemons'
    group's id is the driver's pid. A driver that leads its own group (started straight from an
    interactive shell) joins a group the reaper starts instead, and leads its own again after:
    the daemons' group is the reaper's (it used to be the driver's own, so a signal to it killed
    Ray's daemons: a 60 s hang, "Failed to connect to GCS", the runs left RUNNING). Only a
    session leader (`setsid cmd`) cannot move: its daemons share its group, and only Ctrl-C or a
    signal to the driver's pid is caught cleanly. With `local` (a Ray this process starts),
    a reaper joins the group: a driver killed outright (SIGKILL, the OOM killer) takes the raylet
    with it, but its DashboardAgent and RuntimeEnvAgent lingered 1.5 to 3 minutes; the reaper
    ends the group within a second of the driver."""
    global _daemon_group
    own = os.getpgrp()
    if own == os.getpid() != os.getsid(0) and local:  # leads its group: to the reaper's
        with _in_reapers_group() as group:
            yield
        _daemon_group = group
        return
    try:
        os.setpgid(0, 0)
    except OSError:  # already a session leader
        try:
            yield
        finally:
            if local:
                start_reaper()
        return
    try:
        yield
    finally:
        if local:
            start_reaper()  # now, while this process is in the daemons' group
        if own != os.getpid():
            os.setpgid(0, own)
            _daemon_group = os.getpid()  # now holds the daemons alone (none on a cluster)


def start_reaper(own_group: bool = False):
    import subprocess

    return subprocess.Popen([sys.executable, "-c", REAPER, str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, close_fds=True,
                            process_group=0 if own_group else None)


@contextlib.contextmanager
def _in_reapers_group():
    """For a driver that leads its process group (started from an interactive shell: a signal to
    the group is the documented stop), which cannot make a group of its own: the reaper starts
    in a new group, the driver joins it while Ray spawns its daemons, then leads its own group
    again (setpgid to its pid). The daemons stay in the reaper's group, out of the signal's
    reach. Yields that group's id."""
    reaper = start_reaper(own_group=True)
    group = reaper.pid
    with contextlib.suppress(OSError):  # the child may have made its group already (or exec'd)
        os.setpgid(group, group)
    os.setpgid(0, group)
    try:
        yield group
    finally:
        os.setpgid(0, 0)
