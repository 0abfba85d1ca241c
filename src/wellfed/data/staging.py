"""Token files on many nodes: upload once to shared storage, copy once per node, mmap locally.

When `ray.storage_path` is shared storage (an NFS path or a pyarrow.fs URI such as s3://...),
the driver uploads the token files to `<storage>/wellfed-tokens/<sha256>/` unless a finished
upload with that hash is already there. Each node copies them once into a local cache keyed by
the hash (an atomic rename, so concurrent workers on a node never see half a copy) and
memory-maps the local copy. On a single machine with the default storage nothing is copied.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pyarrow.fs as pafs

DONE = "_COMPLETE"
FILES = ("train.arrow", "validation.arrow", "meta.json")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) for a local path or a pyarrow.fs URI."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), str(Path(uri).expanduser().resolve())
    return pafs.FileSystem.from_uri(uri)


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def upload(tokens_dir: Path, storage_uri: str, digest: str) -> tuple[str, bool]:
    """Upload the token files under `storage_uri`; return (their URI, whether bytes were sent)."""
    fs, root = filesystem(storage_uri)
    dest = f"{root}/wellfed-tokens/{digest}"
    uri = dest if "://" not in storage_uri else f"{storage_uri.split('://')[0]}://{dest}"
    if exists(fs, f"{dest}/{DONE}"):
        return uri, False
    fs.create_dir(dest, recursive=True)
    local = pafs.LocalFileSystem()
    for name in FILES:
        pafs.copy_files(str(tokens_dir.resolve() / name), f"{dest}/{name}",
                        source_filesystem=local, destination_filesystem=fs)
    with fs.open_output_stream(f"{dest}/{DONE}") as marker:  # last: marks the upload whole
        marker.write(digest.encode())
    return uri, True


def cache_root() -> Path:
    return Path(os.environ.get("WELLFED_CACHE", Path.home() / ".cache" / "wellfed"))


def localize(tokens_uri: str, digest: str) -> Path:
    """This node's local copy of the staged token files (copied on first use)."""
    target = cache_root() / "tokens" / digest
    if (target / DONE).is_file():
        return target
    fs, remote = filesystem(tokens_uri)
    tmp = target.parent / f".{digest}.{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        for name in (*FILES, DONE):
            pafs.copy_files(f"{remote}/{name}", str(tmp / name), source_filesystem=fs,
                            destination_filesystem=pafs.LocalFileSystem())
        tmp.rename(target)
    except OSError:
        if not (target / DONE).is_file():  # not simply another worker on this node winning
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
