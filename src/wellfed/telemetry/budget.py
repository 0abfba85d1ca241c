"""A stage's time budget from process start: where every second of a stage, and of the pipeline
run that started it, went.

A DVC stage is a fresh process, so a stage's time starts when the process did (the interpreter,
the imports), not when `main()` does. `Budget` holds a stage's named parts (telemetry/phases.py
`Phases`), the first of them "start + imports" (process start to the stage's entry); what no
part covers is "other". Each stage writes its budget as JSON (dvc.yaml passes the path as
`--time data/reports/time/<stage>.json`) and ends with one line of its biggest parts.

Stages started by one `dvc repro` (or `dvc exp run`) share that dvc process: each budget names
it (pid and start time), so the last stage can add up the stages of its own pipeline run and
the seconds DVC spent before and between them (`pipeline`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from wellfed.telemetry.phases import Phases

START = "start + imports"
"""The first part of every stage: process start (the interpreter) to the stage's `main()`."""


def process_started(pid: int | str = "self") -> float | None:
    """When process `pid` started, in epoch seconds (Linux /proc, to ~10 ms); None elsewhere.
    /proc/<pid>/stat's start time counts clock ticks since boot and /proc/uptime says how long
    ago the boot was, to 0.01 s (btime in /proc/stat is whole seconds)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22; the name may hold spaces
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def dvc_parent() -> dict | None:
    """The dvc process (`dvc repro`, `dvc exp run`, a queue worker) this stage runs under:
    {"pid", "started_at"}, the nearest ancestor whose command line runs dvc; None without one."""
    pid = os.getppid()
    for _ in range(8):  # stage <- sh -c <- dvc, a few levels at most
        if pid <= 1:
            return None
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        if any(Path(a.decode(errors="replace")).name == "dvc" for a in argv[:2] if a):
            return {"pid": pid, "started_at": process_started(pid)}
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    return None


@dataclass
class Budget:
    """One stage's seconds since its process started, in named parts."""

    stage: str
    started_at: float
    """Epoch seconds when the process started."""
    clock: Phases = field(default_factory=Phases)
    work: str | None = None
    """The part that is the stage's work (train: "steps"); the rest is its fixed cost."""
    dvc: dict | None = None
    path: Path | None = None
    """Where the stage writes it (`--time`); None: printed only."""
    after: list[str] = field(default_factory=list)
    """Lines to print after the stage's own (the pipeline's, at the last stage)."""

    @classmethod
    def begin(cls, stage: str, work: str | None = None, path: Path | None = None) -> Budget:
        """A stage's budget, started now at its entry: "start + imports" holds the time since
        the process started."""
        now = time.time()
        started = process_started() or now
        return cls(stage, started, Phases({START: now - started}), work, dvc_parent(), path)

    def record(self) -> dict:
        """The budget as the JSON file holds it: parts in the order first timed."""
        ended = time.time()
        total = ended - self.started_at
        parts = {k: round(v, 3) for k, v in self.clock.seconds.items()}
        other = total - sum(self.clock.seconds.values())
        record = {"stage": self.stage, "total_s": round(total, 3), "parts_s": parts,
                  "other_s": round(max(other, 0.0), 3), "started_at": round(self.started_at, 3),
                  "ended_at": round(ended, 3), "dvc": self.dvc}
        if self.work:
            record["work"] = self.work
            record["fixed_s"] = round(total - self.clock.seconds.get(self.work, 0.0), 3)
        return record


def line(record: dict, top: int = 6) -> str:
    """'train 53.2 s: steps 36.8, mlflow run start 2.9, ... (+5 parts 1.4); fixed cost (all but
    steps) 16.4 s': the biggest parts, the rest summed."""
    parts = dict(record["parts_s"])
    if record.get("other_s", 0.0) >= 0.05:
        parts["other"] = record["other_s"]
    ranked = sorted(parts.items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{name} {secs:.1f}" for name, secs in ranked[:top])
    rest = ranked[top:]
    if rest:
        shown += f" (+{len(rest)} more {sum(s for _, s in rest):.1f})"
    text = f"{record['stage']} {record['total_s']:.1f} s: {shown}"
    if "fixed_s" in record:
        text += f"; fixed cost (all but {record['work']}) {record['fixed_s']:.1f} s"
    return text


def write(path: Path, record: dict) -> None:
    from wellfed.outputs import write_json

    write_json(path, record)


def same_process(a: dict | None, b: dict) -> bool:
    """The same dvc process: its pid, and a start time that agrees to a second (each stage
    reads it from /proc on its own, to ~10 ms; a pid reused later starts later)."""
    return bool(a) and a["pid"] == b["pid"] and abs((a.get("started_at") or 0.0)
                                                   - b["started_at"]) < 1.0


def pipeline(folder: Path, last: dict) -> dict | None:
    """The pipeline run `last` (a stage's record) belongs to: every stage budget in `folder`
    started by the same dvc process, in order, and DVC's own seconds from its start to the end
    of `last` that no stage covers (its start, hashing, lock updates between stages). None when
    `last` ran outside dvc."""
    dvc = last.get("dvc")
    if not dvc or not dvc.get("started_at"):
        return None
    stages = [last]
    for path in sorted(folder.glob("*.json")):
        try:
            other = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if other.get("stage") != last["stage"] and same_process(other.get("dvc"), dvc):
            stages.append(other)
    stages.sort(key=lambda r: r["started_at"])
    total = last["ended_at"] - dvc["started_at"]
    dvc_s = max(total - sum(r["total_s"] for r in stages), 0.0)
    work = sum(r["parts_s"].get(r["work"], 0.0) for r in stages if r.get("work"))
    return {"total_s": round(total, 3), "stages_s": {r["stage"]: r["total_s"] for r in stages},
            "dvc_s": round(dvc_s, 3), "work_s": round(work, 3),
            "fixed_s": round(total - work, 3), "stages": stages}


def pipeline_line(summary: dict) -> str:
    """'pipeline 69.0 s since dvc started: train 53.2, evaluate 8.2, dvc 4.4, ...; fixed cost
    (all but steps) 32.2 s'."""
    parts = {**summary["stages_s"], "dvc": summary["dvc_s"]}
    shown = ", ".join(f"{k} {v:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
    return (f"pipeline {summary['total_s']:.1f} s since dvc started: {shown}; fixed cost (all "
            f"but steps) {summary['fixed_s']:.1f} s")
