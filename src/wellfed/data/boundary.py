"""Where a stage may read the files params.yaml names: inside the folder the pipeline gives it
(prepare: the raw folder, dvc.yaml's `data/raw`; the predict stage: the project), unless the
section's `allow_outside` says otherwise on purpose.

Why: a path in params.yaml is a value whoever edits params (or passes `dvc exp run -S`)
chooses. Read unchecked, `prepare.train: ../../../../etc/passwd`, an absolute path or a link
in data/raw to /etc/passwd are read, and a reader's error quotes the file's first line. And DVC
hashes only what dvc.yaml names: prepare's dep is data/raw, so a file named outside it directly
is read but not tracked, and editing it never reruns prepare.

A path is inside when its real path (every link followed, `..` resolved) is inside the real path
of the folder: a link in data/raw to another file in data/raw is fine, one to /etc/passwd is not.
The check runs before anything is opened, so no message carries a byte of a refused file; it
names the key, the value as written and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path


def _real(path: Path) -> str:
    return os.path.realpath(path)


def _within(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def confined(folder: str | Path, names: dict[str, str], *, allow_key: str, allowed: bool,
             folder_words: str, put_in: str, stage: str | None) -> tuple[dict[str, Path], list[str]]:
    """The files `names` (params key -> its value: a path relative to `folder`, or absolute)
    name, as paths to read, and the warnings to give; every refused key in one ValueError.

    `allow_key` is the params key that lets them out (`prepare.allow_outside`), `allowed` its
    value; `folder_words` says what the folder is ("the raw folder data/raw"), `put_in` where
    the fix puts a file ("data/raw"). `stage` is the stage DVC would rerun when a file changes,
    when DVC tracks only the folder: allowed outside, a file named by an absolute path or `..`
    (not through the folder) then gets a warning that DVC does not see it; a link in the folder
    needs none (DVC hashes what a link points to). `stage` None: DVC tracks each file (the
    predict stage's dep is its file), so no warning."""
    folder = Path(folder)
    base = _real(folder)
    paths, problems, warnings = {}, [], []
    for key, name in names.items():
        if "\x00" in name:  # the OS refuses such a path; say so before it does
            problems.append(f"{key} {name!r} holds a NUL character; name the file without it")
            continue
        path = folder / name
        real = _real(path)
        paths[key] = path
        if _within(real, base):
            continue
        through = _within(os.path.abspath(path), os.path.abspath(folder))  # links not followed
        if allowed:
            if stage and not through:
                warnings.append(
                    f"{key} reads {real}, outside {folder_words} ({allow_key}: true): DVC does "
                    f"not track it, so a change to it does not rerun {stage}; name a link to it "
                    f"in {put_in} instead (DVC hashes what a link points to), or run "
                    f"`dvc repro -f {stage}` after changing it")
            continue
        if through:
            problems.append(f"{key} {name!r} is a link to {real}, outside {folder_words}; put "
                            f"the file itself in {put_in}, or set {allow_key}: true to read it "
                            "where it is")
        else:
            problems.append(f"{key} {name!r} is outside {folder_words}; put the file in "
                            f"{put_in} and name it there, or set {allow_key}: true to read it "
                            "where it is")
    if problems:
        raise ValueError("; ".join(problems))
    return paths, warnings
