"""Fetch GLUE SST-2 from the Hugging Face Hub as the three GLUE TSV files the tests and the SST-2
benchmarks read: train.tsv and dev.tsv (`sentence<TAB>label`, 0 = negative, 1 = positive) and
test.tsv (`index<TAB>sentence`, no labels: GLUE hides them). By default into ../shared/data/sst2,
beside the project, where tests/conftest.py's SST2 looks; the real-data tests skip without it.

usage: python scripts/fetch_sst2.py [--out DIR]

Needs the Hub (the dataset nyu-mll/glue, config sst2: 67,349 / 872 / 1,821 rows), so run it with
HF_HUB_OFFLINE unset or 0 (the Makefile sets 1). Without the Hub it stops with one line that
says so; the GLUE SST-2.zip's three files, copied into DIR, do the same.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = "nyu-mll/glue"
SPLITS = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
"""The Hub's split -> the GLUE file name."""
ROWS = {"train": 67_349, "validation": 872, "test": 1_821}
"""Rows per split (the GLUE zip, and the Hub dataset's card): a check of what arrived."""


def fail(line: str) -> None:
    print(f"error: {line}", file=sys.stderr)
    sys.exit(1)


def hub_files() -> dict[str, str]:
    """split -> the Parquet file of `REPO` holding it (sst2/<split>-00000-of-00001.parquet)."""
    from huggingface_hub import HfApi

    # One request, no retries (a file listing retries 5 times, 23 s, where nothing answers).
    info = HfApi().dataset_info(REPO, timeout=10)
    files = [sibling.rfilename for sibling in info.siblings or []]
    found = {split: next((f for f in files if f.startswith(f"sst2/{split}-")
                          and f.endswith(".parquet")), None) for split in SPLITS}
    missing = [split for split, name in found.items() if name is None]
    if missing:
        fail(f"{REPO} on the Hub has no sst2 Parquet file for {', '.join(missing)}; its "
             "layout changed: copy GLUE's SST-2 train.tsv, dev.tsv and test.tsv by hand")
    return found


def write_tsv(frame, split: str, path: Path) -> None:
    """GLUE's layout: no quoting (the sentences hold no tab, newline or quote), LF endings."""
    if split == "test":
        lines = ["index\tsentence"] + [f"{i}\t{s}" for i, s in zip(frame["idx"], frame["sentence"])]
    else:
        lines = ["sentence\tlabel"] + [f"{s}\t{y}" for s, y in zip(frame["sentence"], frame["label"])]
    if any("\t" in s or "\n" in s for s in frame["sentence"]):
        fail(f"{split}: a sentence holds a tab or a newline; GLUE's TSV cannot hold it")
    staging = path.with_name(path.name + ".tmp")
    staging.write_text("\n".join(lines) + "\n", encoding="utf-8")
    staging.replace(path)


def main(argv: list[str]) -> None:
    project = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=project.parent / "shared" / "data" / "sst2",
                        help="where the three files go (default: ../shared/data/sst2)")
    args = parser.parse_args(argv)
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        fail("HF_HUB_OFFLINE is on (the Makefile sets it), so the Hub is not asked: run "
             "HF_HUB_OFFLINE=0 python scripts/fetch_sst2.py")
    import pandas as pd
    from huggingface_hub import constants, hf_hub_download

    try:
        files = hub_files()
        local = {split: hf_hub_download(REPO, name, repo_type="dataset")
                 for split, name in files.items()}
    except SystemExit:
        raise
    except Exception as err:  # no network, DNS, a proxy, the Hub's own error
        fail(f"the Hugging Face Hub ({constants.ENDPOINT}) did not give {REPO}'s sst2 files "
             f"({type(err).__name__}: {str(err).splitlines()[0][:200]}); run this where the Hub "
             f"is reachable, or copy GLUE's SST-2 train.tsv, dev.tsv and test.tsv into {args.out}")
    args.out.mkdir(parents=True, exist_ok=True)
    for split, path in local.items():
        frame = pd.read_parquet(path)
        if len(frame) != ROWS[split]:
            fail(f"{split}: {len(frame)} rows from the Hub, GLUE has {ROWS[split]}; not written")
        write_tsv(frame, split, args.out / SPLITS[split])
        print(f"[wellfed] SST-2 {split}: {len(frame):,} rows -> {args.out / SPLITS[split]}")


if __name__ == "__main__":
    main(sys.argv[1:])
