"""prepare: raw labelled files (or a Hub dataset) -> cleaned, id-labelled splits + data report.

usage: python stages/prepare.py RAW_DIR PREPARED_DIR REPORT_JSON
"""

import functools
import logging
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from wellfed.cli import stage
from wellfed.config import load_params
from wellfed.data import boundary, prepare, sources
from wellfed.data.report import summary
from wellfed.outputs import atomic_path, check_room, write_json

log = logging.getLogger("wellfed.prepare")


@stage
def main(raw_dir, prepared_dir, report_json, *, budget):
    with budget.clock("params"):
        (cfg,) = load_params("params.yaml", "prepare")
    named = {split: getattr(cfg, split) for split in ("train", "validation", "test")
             if getattr(cfg, split)}
    paths, outside = {}, []
    if not cfg.hub_dataset:  # before a byte is read: no path leaves the raw folder unasked
        paths, outside = boundary.confined(
            raw_dir, {f"prepare.{split}": name for split, name in named.items()},
            allow_key="prepare.allow_outside", allowed=cfg.allow_outside,
            folder_words=f"the raw folder {raw_dir}", put_in=raw_dir, stage="prepare")
    raw, files = {}, []
    for split, name in named.items():
        if cfg.hub_dataset:
            frame = sources.read_hub(cfg.hub_dataset, cfg.hub_config, name, cfg.text_column,
                                     cfg.label_column)
            raw[split] = (lambda frame=frame: [frame], f"hub:{cfg.hub_dataset}/{name}")
        else:
            path = paths[f"prepare.{split}"]
            files.append(path)
            raw[split] = (functools.partial(sources.iter_file, path, cfg.format, cfg.text_column,
                                            cfg.label_column, header=cfg.header,
                                            quoting=cfg.quoting), str(path))
    # Before reading a row: the output folders and the temp folder take files and have room
    # (the prepared splits and the first pass's copy are each about the raw files' size).
    size = sum(path.stat().st_size for path in files if path.is_file())
    check_room({Path(prepared_dir).parent: size, Path(report_json).parent: 0,
                Path(tempfile.gettempdir()): size})
    # The first pass keeps the cleaned rows in the temp folder (about the raw data's size).
    with tempfile.TemporaryDirectory(prefix="wellfed-prepare-") as scratch, \
            budget.clock("read + clean + write"):
        splits, names, report = prepare.prepare_blocks(raw, cfg, Path(scratch))
        report["warnings"] = outside + report["warnings"]
        with atomic_path(prepared_dir, is_dir=True) as tmp:
            for split, frames in splits.items():
                write_parquet(tmp / f"{split}.parquet", frames)
            write_json(tmp / "labels.json", {"names": names, "task": report["task"],
                                             "text_columns": [str(c) for c in cfg.text_columns()]})
    write_json(report_json, report)
    for line in summary(report, report_json):
        print(f"[wellfed] {line}")
    for warning in report["warnings"]:  # after the outputs: an error stays the only stderr line
        log.warning("warning: %s", warning)


def write_parquet(path: Path, frames) -> None:
    """One Parquet file from a split's frames, as they come."""
    writer = None
    try:
        for frame in frames:
            table = pa.Table.from_pandas(frame, preserve_index=False)
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


if __name__ == "__main__":
    main()
