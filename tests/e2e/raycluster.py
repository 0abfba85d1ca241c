"""A real Ray cluster of several nodes on this one machine, for the e2e tier: a head and more
raylets, each started by `ray start ... --block` with a `--temp-dir` of its own, each in a
session of its own, so that one node can be killed alone (`kill_node`), as a machine goes down.

What this machine showed (Ray 2.60, one host, 2 cores):
- `--temp-dir` can be given per node (`ray start --help`: "Can be specified per node"); two
  raylets on one IP each keep their sockets and logs under their own folder.
- A driver (`ray.init(address=...)`) on a host with several raylets attaches to the head's
  ("prioritize the head node", ray._private.services): killing another node never takes the
  driver with it, as on a real cluster where that node is another machine.
- Ray starts each worker process in a process group of its own, titled `ray::IDLE`: killing
  a node's group leaves its workers, which exit when they lose their raylet. `processes` finds
  them by the raylet their environment names (RAY_RAYLET_PID), and `kill_node` and `stop` end
  them with the rest.
- The head notices a killed node only after its health checks fail: 57 s with Ray's defaults.
  The head here checks every 0.5 s and gives up after 3 missed checks (`--system-config`), so
  a lost node is noticed in a few seconds.
- Auth is off (RAY_AUTH_MODE=disabled, as ray.cluster_utils runs): no token files in ~/.ray,
  which other Ray runs on this machine share.
- Never `ray stop`: it stops every Ray on the machine, other people's clusters included.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tests.services import free_port

HEALTH = {"health_check_period_ms": 500, "health_check_timeout_ms": 1000,
          "health_check_failure_threshold": 3}
"""The head's checks of its nodes: a killed node is marked dead ~2-5 s later (57 s with Ray's
defaults on this machine)."""


class RayCluster:
    """Nodes of one cluster on this machine: `cpus[i]` CPUs (and `gpus[i]` logical GPUs) each,
    node 0 the head. `env` is what a client (a driver, `dvc queue start`) needs to join it."""

    def __init__(self, cpus: list[int], gpus: list[int] | None = None,
                 base_env: dict | None = None):
        # Its own short folder: Ray's socket paths under it must stay within AF_UNIX's 107
        # bytes, which pytest's tmp_path (/tmp/pytest-of-root/pytest-N/test_.../) overran.
        self.root = Path(tempfile.mkdtemp(prefix="wfray-"))
        self.cpus, self.gpus = cpus, gpus or [0] * len(cpus)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**(base_env or os.environ), "RAY_ADDRESS": self.address,
                    "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        self.nodes: list[subprocess.Popen | None] = [None] * len(cpus)

    def folder(self, i: int) -> Path:
        return self.root / f"node{i}"

    def _start_node(self, i: int) -> None:
        folder = self.folder(i)
        folder.mkdir(parents=True, exist_ok=True)
        args = ["ray", "start", "--block", f"--temp-dir={folder}",
                f"--num-cpus={self.cpus[i]}", f"--num-gpus={self.gpus[i]}",
                "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
        if i == 0:
            args += ["--head", f"--port={self.port}", "--include-dashboard=false",
                     f"--dashboard-port={free_port()}", f"--system-config={json.dumps(HEALTH)}"]
        else:
            args += [f"--address={self.address}"]
        env = {k: v for k, v in self.env.items() if k != "RAY_ADDRESS"}
        log = open(self.root / f"ray-start-{i}.log", "a")
        self.nodes[i] = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def start(self, timeout: float = 180) -> RayCluster:
        """Start every node, one after the other; return once all are alive."""
        for i in range(len(self.cpus)):
            self._start_node(i)
            self.wait_for_nodes(i + 1, timeout)
        return self

    def alive(self) -> list[dict]:
        """Every live node's record (NodeID, Resources, ...), asked of the head by a client
        process (this test process never joins the cluster itself)."""
        probe = ("import json, ray; ray.init(logging_level='ERROR'); "
                 "print(json.dumps([{'id': n['NodeID'], 'resources': n['Resources']} "
                 "for n in ray.nodes() if n['Alive']]))")
        with socket.socket() as s:  # the head's GCS takes connections: else ray.init would
            s.settimeout(1)         # wait for it a minute and more
            if s.connect_ex(("127.0.0.1", self.port)):
                return []
        try:
            proc = subprocess.run([sys.executable, "-c", probe], env=self.env,
                                  capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return []
        if proc.returncode:
            return []
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def wait_for_nodes(self, count: int, timeout: float = 180) -> list[dict]:
        """Until exactly `count` nodes are alive (a start, or a killed node noticed)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for i, node in enumerate(self.nodes):
                if node is not None and node.poll() is not None:
                    log = (self.root / f"ray-start-{i}.log").read_text()[-2000:]
                    raise RuntimeError(f"ray node {i} exited ({node.returncode}):\n{log}")
            nodes = self.alive()
            if len(nodes) == count:
                return nodes
            time.sleep(1)
        raise TimeoutError(f"the cluster did not reach {count} live node(s) in {timeout} s")

    def processes(self, i: int | None = None) -> list[psutil.Process]:
        """This cluster's processes (of node `i` only, when given): every process whose command
        line names a node's folder (`ray start`, GCS, raylet, agents), and the workers, whose
        command line is Ray's title (`ray::IDLE`) but whose environment names their raylet
        (RAY_RAYLET_PID)."""
        folders = [str(self.folder(j)) for j in (range(len(self.cpus)) if i is None else [i])]
        found, raylets = [], set()
        for p in psutil.process_iter(["pid", "cmdline"]):
            line = " ".join(p.info["cmdline"] or [])
            if any(f in line for f in folders):
                found.append(p)
                if "raylet" in line.split(" ")[0]:
                    raylets.add(str(p.pid))
        for p in psutil.process_iter(["pid", "cmdline"]):
            if (p.info["cmdline"] or [""])[0].startswith("ray::"):
                with contextlib.suppress(psutil.Error):
                    if p.environ().get("RAY_RAYLET_PID") in raylets:
                        found.append(p)
        return found

    def kill_node(self, i: int) -> float:
        """SIGKILL node `i` (not the head) and every process of it, as a machine going down;
        return the time it was killed."""
        assert i > 0, "the head holds the cluster: kill another node"
        doomed = self.processes(i)
        killed = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.nodes[i].pid, signal.SIGKILL)
        for p in doomed:
            with contextlib.suppress(psutil.Error):
                p.kill()
        self.nodes[i].wait(timeout=30)
        self.nodes[i] = None
        return killed

    def restart_node(self, i: int, timeout: float = 180) -> None:
        """Start killed node `i` again, as a replacement machine joins: a new raylet (a new
        node id) in the same folder; return once it is alive."""
        assert self.nodes[i] is None, f"node {i} is running"
        self._start_node(i)
        self.wait_for_nodes(sum(node is not None for node in self.nodes), timeout)

    def head_id(self) -> str:
        """The head's node id (the one holding Ray's `node:__internal_head__` resource)."""
        return next(n["id"] for n in self.alive() if "node:__internal_head__" in n["resources"])

    def stop(self) -> None:
        """End every node and every process of the cluster at once (SIGKILL: a test cluster
        keeps nothing worth an orderly stop, which took 15 s here), until none is left."""
        deadline = time.time() + 30
        while True:
            left = self.processes()
            for node in self.nodes:
                if node is not None and node.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(node.pid, signal.SIGKILL)
            for p in left:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            if not left or time.time() > deadline:
                break
            time.sleep(0.5)
        for node in self.nodes:
            if node is not None:
                node.wait(timeout=30)
        self.nodes = [None] * len(self.cpus)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def ray_cluster(cpus: list[int], gpus: list[int] | None = None, base_env: dict | None = None):
    """A started `RayCluster`, stopped on the way out, also when the test fails."""
    cluster = RayCluster(cpus, gpus, base_env)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
