"""wellfed's checkpoint store: one training run's checkpoints, in a local folder or on shared
storage (a pyarrow.fs URI), the same for both engines (in-process and Ray Train).

    <storage>/<run>/                      the run folder (train/run/runs.py: its name and
                                          wellfed_run.json)
      01-in_process/                      a launch: one stage process's training, in-process or one
      02-ray_train/                         Ray Train fit (then also Ray's run folder)
        launch.json                       engine, start time, and its seconds once it ends
        checkpoint_000040/                complete: checkpoint.py's files + manifest.json, and
                                          `registered` once its report reached the driver
        .checkpoint_000050.tmp-<hex>/     being written: never read, removed by the next launch
      damaged-02-checkpoint_000050/       failed its check on a resume: moved aside, removed
                                          once the next checkpoint is registered

A checkpoint is written under a temporary name, its manifest (every file's size and sha256)
last, and renamed when complete, so a folder named `checkpoint_*` is whole unless something
damaged it afterwards (a disk error, a partial copy). Object stores have no rename: there the
files go to the final name and the manifest, written last, is what marks it complete. What
the store keeps while training and once the run completes: train/checkpoints/retention.py.
A checkpoint counts once its report has reached the driver, which logged its steps to MLflow
and then marks it `registered` (`register`): a resume from one whose report was lost (the
driver killed meanwhile) would leave those steps out of the MLflow run forever. A resume checks
the newest registered checkpoint against its manifest and, on a local store, that torch loads
its pickles (`recover`: a file planted with its manifest, or one from a torch that pickles what
this one refuses, matches its manifest), moves a damaged one aside and says so in one line,
and resumes from the newest good one.

Why a folder per launch: Ray Train reloads the records of a run folder it has seen before and
fails when a checkpoint they list is gone (pruned, moved aside, deleted by hand). A fit of its
own never reloads anything: its workers start from what this store found good (train/run/worker.py),
and Ray registers every checkpoint this store writes for it (`ray.train.report(
checkpoint_upload_fn=...)`), so a worker restart (`ray.max_failures`) resumes from the latest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow.fs as pafs

from wellfed.data import staging
from wellfed.disk import file_sha256, usage
from wellfed.outputs import shown, write_fault
from wellfed.train.checkpoints import checkpoint
from wellfed.train.checkpoints.state import TrainState

LAUNCH = re.compile(r"(\d{2,})-(in_process|ray_train|ray_task)")
ENTRY = re.compile(r"checkpoint_(\d+)")
LAUNCH_FILE = "launch.json"
CHUNK = 8 << 20  # sha256 runs at ~0.5-1 GB/s here: hashing 87 MB (MiniLM fp32) costs ~0.1-0.2 s


@dataclass(frozen=True)
class Entry:
    """One checkpoint folder of the run."""

    path: str
    """Its path on the store's filesystem."""
    launch: str
    """The launch folder holding it ('' for a folder at the run's top: an older wellfed's)."""
    step: int

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def dir_name(step: int) -> str:
    """A checkpoint's folder name: zero-padded, so names sort as steps do."""
    return f"checkpoint_{step:06d}"


class Store:
    """The checkpoints of run `name` under `storage_uri` (a folder or a pyarrow.fs URI)."""

    def __init__(self, storage_uri: str, name: str):
        self.uri, self.name = storage_uri, name
        self.fs, root = staging.filesystem(storage_uri)
        self.dir = f"{root}/{name}"
        # Local folders (NFS included) rename; object stores (s3://, gs://) do not.
        self.renames = isinstance(self.fs, pafs.LocalFileSystem)

    def shown(self, path: str) -> str:
        """`path` as the console shows it: relative to the project (the working directory)
        where it is inside it (`data/checkpoints/wf-…/01-in_process/checkpoint_000040`)."""
        return shown(Path(path)) if self.renames else path

    def children(self, path: str) -> list[pafs.FileInfo]:
        return sorted((i for i in self.fs.get_file_info(pafs.FileSelector(
            path, allow_not_found=True)) if i.type == pafs.FileType.Directory),
            key=lambda i: i.base_name)

    def launches(self) -> list[str]:
        return [i.base_name for i in self.children(self.dir) if LAUNCH.fullmatch(i.base_name)]

    def open_launch(self, engine: str) -> str:
        """A new launch folder for this process's training (`engine`: in_process, ray_task or
        ray_train); returns its name."""
        numbers = [int(LAUNCH.fullmatch(n).group(1)) for n in self.launches()]
        name = f"{max(numbers, default=0) + 1:02d}-{engine}"
        try:
            self.fs.create_dir(f"{self.dir}/{name}", recursive=True)
            self.write_json(f"{self.dir}/{name}/{LAUNCH_FILE}",
                             {"engine": engine, "started": time.time()})
        except OSError as err:
            raise write_fault(self.shown(self.dir), err, "then rerun `dvc repro`") from None
        return name

    def close_launch(self, launch: str, seconds: float) -> None:
        """Record the launch's training seconds (train/seconds sums them over a run's launches)."""
        path = f"{self.dir}/{launch}/{LAUNCH_FILE}"
        with contextlib.suppress(OSError, ValueError):  # a diagnostic: never the stage's failure
            self.write_json(path, {**self.read_json(path), "seconds": round(seconds, 3)})

    def seconds_before(self) -> float:
        """The training seconds of the run's launches so far. One killed outright (SIGKILL, a
        lost node) never recorded its own: it counts until its newest checkpoint."""
        total = 0.0
        for launch in self.launches():
            with contextlib.suppress(OSError, ValueError):
                record = self.read_json(f"{self.dir}/{launch}/{LAUNCH_FILE}")
                if "seconds" in record:
                    total += record["seconds"]
                    continue
                written = [self.read_json(f"{e.path}/{checkpoint.MANIFEST}")["written"]
                           for e in self.entries() if e.launch == launch]
                total += max(written, default=record["started"]) - record["started"]
        return total

    def entries(self) -> list[Entry]:
        """Every checkpoint folder, oldest first (by step, then launch). Folders at the run's
        top come from an older wellfed (Ray's layout, no manifest): `recover` says so."""
        found = [Entry(i.path, "", -1) for i in self.children(self.dir)
                 if i.base_name.startswith("checkpoint_")]
        for launch in self.launches():
            for info in self.children(f"{self.dir}/{launch}"):
                if match := ENTRY.fullmatch(info.base_name):
                    found.append(Entry(info.path, launch, int(match.group(1))))
        return sorted(found, key=lambda e: (e.step, e.launch))

    def latest(self) -> Entry | None:
        """The newest registered checkpoint, unchecked (what a resume would try first)."""
        found = [e for e in self.entries() if self.registered(e)]
        return found[-1] if found else None

    def register(self, path: str) -> None:
        """The driver has the report of the checkpoint at `path` (its steps are in MLflow); a
        good checkpoint now stands in for any damaged ones moved aside: they go."""
        try:
            self.write_json(f"{path}/{checkpoint.REGISTERED}", {"at": time.time()})
        except OSError as err:
            raise write_fault(self.shown(self.dir), err, checkpoint.RESUME) from None
        self._drop_damaged(path)

    def _drop_damaged(self, good: str) -> None:
        """Remove the damaged checkpoints `recover` moved aside (kept until then to be looked
        at: 737 MB of them stayed until the run completed) and say what was freed."""
        damaged = [i.path for i in self.children(self.dir) if i.base_name.startswith("damaged-")]
        if not damaged:
            return
        sizes = usage({path: Path(path) for path in damaged}) if self.renames else {}
        for path in damaged:
            self.fs.delete_dir(path)
        freed = f" ({sum(sizes.values()) / 1e6:,.1f} MB)" if sizes else ""
        print(f"[wellfed] removed the damaged checkpoint(s) moved aside{freed}: "
              f"{good.rsplit('/', 1)[-1]} stands in for them", flush=True)

    def registered(self, entry: Entry) -> bool:
        return staging.exists(self.fs, f"{entry.path}/{checkpoint.REGISTERED}")

    @contextlib.contextmanager
    def scratch(self, launch: str) -> Iterator[Path]:
        """A folder for the loop to write one checkpoint into: on a local store a `.tmp-` folder
        inside `launch`, which `commit` renames into place instead of copying (MiniLM with Adam:
        270 MB not written twice); on an object store a local temporary folder. Removed
        afterwards if it is still there (a failed write)."""
        if not self.renames:
            with tempfile.TemporaryDirectory(prefix="wellfed-checkpoint-") as tmp:
                yield Path(tmp)
            return
        path = Path(self.dir) / launch / f".scratch.tmp-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir(parents=True)
        except OSError as err:
            raise write_fault(self.shown(self.dir), err, checkpoint.RESUME) from None
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def commit(self, local: Path, launch: str, step: int, rank: int) -> str:
        """Put the checkpoint the loop wrote in `local` into `launch` as step `step` (with its
        selection `rank`, train/step/selection.py): files, then the manifest, then the rename; a
        `scratch` folder of this store is renamed as it is, anything else is copied. Returns
        its path. A folder that cannot be written: WriteFault, nothing left behind."""
        final = f"{self.dir}/{launch}/{dir_name(step)}"
        in_place = self.renames and Path(local).resolve().parent == Path(self.dir, launch).resolve()
        tmp = (str(local) if in_place
               else f"{self.dir}/{launch}/.{dir_name(step)}.tmp-{uuid.uuid4().hex[:8]}")
        into = tmp if self.renames else final
        try:
            files = {}
            if not in_place:
                self.fs.create_dir(into, recursive=True)
            for path in sorted(local.rglob("*")):
                rel = path.relative_to(local).as_posix()
                if in_place:
                    if path.is_file():
                        files[rel] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
                elif path.is_dir():  # profile/: object stores need no folders, local ones do
                    self.fs.create_dir(f"{into}/{rel}")
                else:
                    files[rel] = self._copy(path, f"{into}/{rel}")
            self.write_json(f"{into}/{checkpoint.MANIFEST}", {
                "step": step, "rank": rank, "written": time.time(), "files": files})
            if self.renames:
                if staging.exists(self.fs, final):  # redone after a worker restart: same step
                    self.fs.delete_dir(final)
                self.fs.move(tmp, final)
        except OSError as err:
            with contextlib.suppress(OSError):
                self.fs.delete_dir(into)
            raise write_fault(self.shown(self.dir), err, checkpoint.RESUME) from None
        return final

    def _copy(self, source: Path, dest: str) -> dict:
        digest, size = hashlib.sha256(), 0
        with open(source, "rb") as f, self.fs.open_output_stream(dest) as out:
            while block := f.read(CHUNK):
                digest.update(block)
                out.write(block)
                size += len(block)
        return {"size": size, "sha256": digest.hexdigest()}

    def problem(self, entry: Entry) -> str | None:
        """What is wrong with `entry` against its manifest (a missing file, a size, a sha256),
        in a few words; None when it is whole."""
        try:
            manifest = self.read_json(f"{entry.path}/{checkpoint.MANIFEST}")
        except (OSError, ValueError):
            why = ("an older wellfed's layout" if not entry.launch else
                   "an interrupted write on storage without rename")
            return f"no readable {checkpoint.MANIFEST} ({why})"
        for name, want in manifest["files"].items():
            info = self.fs.get_file_info(f"{entry.path}/{name}")
            if info.type != pafs.FileType.File:
                return f"{name} is missing"
            if info.size != want["size"]:
                return f"{name} has {info.size:,} bytes, its manifest says {want['size']:,}"
            digest = hashlib.sha256()
            with self.fs.open_input_stream(f"{entry.path}/{name}") as f:
                while block := f.read(CHUNK):
                    digest.update(block)
            if digest.hexdigest() != want["sha256"]:
                return f"{name}'s sha256 differs from its manifest's"
        # What the resume will do with it (an object store's worker finds out when it loads).
        return checkpoint.unloadable(Path(entry.path)) if self.renames else None

    def recover(self) -> tuple[Entry | None, str | None]:
        """Before a resume: the newest registered checkpoint that matches its manifest, and a line
        that says what was damaged (None when nothing was). Damaged ones are moved aside (deleted
        on object stores); half-written and unregistered ones are removed. Checking costs a read
        of the newest checkpoint: ~0.2 s for MiniLM's 350 MB, ~1 min for 7B weights + Adam."""
        self.remove_partial()
        damaged = []
        for entry in reversed(self.entries()):
            if entry.launch and not self.registered(entry):  # its report was lost: its steps too
                self.fs.delete_dir(entry.path)
                continue
            problem = self.problem(entry)
            if problem is None:
                return entry, self._damage_line(damaged, entry)
            damaged.append((entry, problem))
            self._set_aside(entry)
        return None, self._damage_line(damaged, None)

    def remove_partial(self) -> None:
        """Remove the `.tmp-` folders of writes a killed process never finished."""
        for launch in self.launches():
            for info in self.children(f"{self.dir}/{launch}"):
                if ".tmp-" in info.base_name:
                    self.fs.delete_dir(info.path)

    def _damage_line(self, damaged: list, good: Entry | None) -> str | None:
        if not damaged:
            return None
        entry, problem = damaged[0]
        more = f" (and {len(damaged) - 1} older one(s))" if len(damaged) > 1 else ""
        then = (f"resuming from {self.shown(good.path)} (step {good.step})" if good else
                "no good checkpoint is left: starting from step 0")
        return (f"[wellfed] damaged checkpoint {self.shown(entry.path)}: {problem}{more}; moved "
                f"aside, {then}")

    def _set_aside(self, entry: Entry) -> None:
        if self.renames:
            prefix = f"{entry.launch}-" if entry.launch else ""
            self.fs.move(entry.path, f"{self.dir}/damaged-{prefix}{entry.name}")
        else:
            self.fs.delete_dir(entry.path)

    @contextlib.contextmanager
    def local(self, entry: Entry) -> Iterator[Path]:
        """`entry` as a local folder: itself, or a downloaded copy (object stores)."""
        if self.renames:
            yield Path(entry.path)
            return
        with tempfile.TemporaryDirectory(prefix="wellfed-checkpoint-") as tmp:
            pafs.copy_files(entry.path, tmp, source_filesystem=self.fs,
                            destination_filesystem=pafs.LocalFileSystem())
            yield Path(tmp)

    def state(self, entry: Entry) -> TrainState:
        """`entry`'s train_state.json, read in place (no download of the weights)."""
        return TrainState.from_json(self.read_json(f"{entry.path}/{checkpoint.STATE}"))

    def read_json(self, path: str) -> dict:
        with self.fs.open_input_stream(path) as f:
            return json.loads(f.read())

    def write_json(self, path: str, data: dict) -> None:
        with self.fs.open_output_stream(path) as f:
            f.write(json.dumps(data, indent=1).encode())

