"""What the checkpoint store keeps: while a run trains, the newest few and the best
(train.keep_checkpoints); once it completes, the exported checkpoint alone, without its optimizer
state, its weights linked to the exported model's files (train/checkpoints/store.py holds the
layout, the writes and the checks)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from wellfed.disk import file_sha256, link_tree
from wellfed.train.checkpoints import checkpoint
from wellfed.train.checkpoints.store import Entry, Store


def prune(store: Store, keep: int | None, best: bool) -> int:
    """While running: keep the `keep` newest checkpoints and, with `best` (train.select:
    best), the one of the highest selection rank; None keeps all. Returns how many went."""
    if keep is None:
        return 0
    found = store.entries()
    ranks = {e.path: rank(store, e) if best else 0 for e in found}
    top = max(found, key=lambda e: (ranks[e.path], e.step, e.launch), default=None)
    stay = {e.path for e in found[-keep:]} | ({top.path} if top and ranks[top.path] else set())
    for entry in found:
        if entry.path not in stay:
            store.fs.delete_dir(entry.path)
    return len(found) - len(stay)


def rank(store: Store, entry: Entry) -> int:
    try:
        return int(store.read_json(f"{entry.path}/{checkpoint.MANIFEST}").get("rank", 0))
    except (OSError, ValueError):
        return 0


def complete(store: Store, chosen: Entry, exported: Path | None) -> int:
    """The run completed: only `chosen` (the exported checkpoint) stays, without its
    optimizer state; its weights become hard links to the `exported` model's files where
    both are on one local filesystem (no bytes), else its model.pt stays. Damaged and
    superseded checkpoints go. Returns how many checkpoint folders were removed."""
    removed = 0
    for info in store.children(store.dir):
        if info.base_name.startswith(("damaged-", "checkpoint_")):
            store.fs.delete_dir(info.path)
            removed += 1
    for entry in store.entries():
        if entry.path != chosen.path:
            store.fs.delete_dir(entry.path)
            removed += 1
    store.remove_partial()
    manifest = store.read_json(f"{chosen.path}/{checkpoint.MANIFEST}")
    with contextlib.suppress(FileNotFoundError):
        store.fs.delete_file(f"{chosen.path}/{checkpoint.OPTIM}")
    manifest["files"].pop(checkpoint.OPTIM, None)
    if exported is not None and store.renames:
        links = Path(chosen.path) / checkpoint.HF_MODEL
        if link_tree(exported, links):
            store.fs.delete_file(f"{chosen.path}/{checkpoint.MODEL}")
            manifest["files"].pop(checkpoint.MODEL, None)
            manifest["files"].update({
                f"{checkpoint.HF_MODEL}/{p.relative_to(links).as_posix()}":
                    {"size": p.stat().st_size, "sha256": file_sha256(p)}
                for p in sorted(links.rglob("*")) if p.is_file()})
    store.write_json(f"{chosen.path}/{checkpoint.MANIFEST}", manifest)
    return removed
