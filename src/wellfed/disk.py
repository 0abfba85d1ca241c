"""Bytes on disk: files shared by hard links, and what a finished training run leaves behind,
a file hard-linked into several places counted once (its first place); and the errno of a failed
write that a library lost on the way (`writing`, `os_error`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO, Iterator

from wellfed.outputs import WriteFault, shown, write_fault


def usage(places: dict[str, Path | None]) -> dict[str, int]:
    """Bytes under each place, in order; a file already counted under an earlier place (the
    same inode: a hard link) adds nothing. A missing place (None, or gone) counts 0."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for label, root in places.items():
        total = 0
        for path in files(root):
            st = path.lstat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
        out[label] = total
    return out


def files(root: Path | None) -> list[Path]:
    if root is None or not os.path.lexists(root):
        return []
    if root.is_file():
        return [root]
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def mb(count: int) -> str:
    return f"{count / 1e6:,.1f} MB"


def left_behind(model_dir: Path, mlflow_model: Path | None, run_dir: Path | None) -> str:
    """`this run leaves 176.3 MB: data/model 88.1 MB, ...`: the stage's line. Shared storage
    and a remote MLflow store are not counted (and say so)."""
    places = {str(model_dir): model_dir, "the MLflow model": mlflow_model,
              "its checkpoints": run_dir}
    sizes = usage(places)
    parts = [f"{label} {mb(sizes[label])}" for label, where in places.items() if where]
    missing = [label for label, where in places.items() if where is None]
    return (f"this run leaves {mb(sum(sizes.values()))} here: {', '.join(parts)} (a file "
            "hard-linked into several of them counts once)"
            + (f"; not counted, not on this machine: {', '.join(missing)}" if missing else ""))


def link_tree(source: Path, dest: Path) -> bool:
    """Hard-link every file under `source` into `dest` (built beside it, renamed when whole);
    False, with nothing left behind, where the filesystem cannot (another device, no links)."""
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        for path in sorted(source.rglob("*")):
            if path.is_file():
                target = tmp / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.hardlink_to(path)
        tmp.rename(dest)
        return True
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


class _Recording:
    """A binary file that keeps the first OSError its writes raised (the library calling them
    may replace it with its own error)."""

    def __init__(self, f: BinaryIO):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def __getattr__(self, name: str):
        return getattr(self.f, name)


@contextlib.contextmanager
def writing(path: Path) -> Iterator[BinaryIO]:
    """`path` open for writing, for a library that loses a failed write's errno: on a full disk
    torch.save raises `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos
    704 vs 598` and numpy an OSError without errno. The OSError of the write itself (ENOSPC) is
    raised instead of theirs, so the caller can say what is wrong with the folder."""
    with open(path, "wb") as raw:  # buffered: a short write of a full disk raises, never returns
        f = _Recording(raw)
        try:
            yield f
        except OSError as err:
            if err.errno is None and f.error is not None:
                raise f.error from None
            raise
        except Exception:
            if f.error is not None:
                raise f.error from None
            raise


OS_ERROR = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")
"""How a library written in Rust (safetensors: `I/O error: No space left on device (os error
28)`) or one that formats an OSError into its own message quotes the errno."""


def os_error(err: BaseException) -> BaseException:
    """`err` as an OSError with its errno where it carries one (itself, or quoted in its
    message: safetensors' `SafetensorError`); else `err` as it is."""
    if isinstance(err, OSError) and err.errno is not None:
        return err
    if match := OS_ERROR.search(str(err)):
        code = int(match.group(1) or match.group(2))
        return OSError(code, os.strerror(code))
    return err


def write_failure(folder: Path, err: BaseException, then: str) -> BaseException:
    """What to raise for a write into `folder` that failed with `err`: the folder's one line
    (outputs.WriteFault: `cannot write data/checkpoints/...: it is full ([Errno 28] No space
    left on device); free some space ..., then ...`) when it is full or read-only, whatever
    library raised it; else `err` itself."""
    fault = write_fault(shown(Path(folder).absolute()), os_error(err), then)
    return fault if isinstance(fault, WriteFault) else err
