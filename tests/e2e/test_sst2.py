"""Real data: all-MiniLM-L6-v2 fine-tuned through the whole pipeline on GLUE SST-2.

Published 6-layer MiniLM-class models reach ~90-92 dev accuracy (../shared/data/ANCHORS.md);
below ~88 on the whole train split suggests a pipeline bug. Skipped when ../shared/data/sst2 is
absent.
"""

import json
import time

import pytest

from tests.conftest import SST2
from tests.e2e.pipeline import make_project, mlflow_runs, run, threads

pytestmark = [pytest.mark.slow, pytest.mark.e2e,
              pytest.mark.skipif(not (SST2 / "train.tsv").is_file(),
                                 reason=f"SST-2 not found at {SST2}")]


ROWS = 5000  # of 67,349


def test_minilm_on_5k_sst2_rows_clears_080_dev_accuracy(tmp_path):
    """The first 5,000 train rows (make test has 30 minutes for everything). 5k rows reached dev
    accuracy 0.8291 in 79 s of training (2026-11-29; 10k rows 0.8475 in twice the time, 20k
    0.8693, the whole split 0.8945). Floor 0.80: about 3 points of seed noise below what 5k rows
    reached, far above a model that learned nothing (the majority class: 0.509)."""
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines(True)
    subset = tmp_path.parent / f"{tmp_path.name}-sst2-train.tsv"
    subset.write_text("".join(lines[:ROWS + 1]), encoding="utf-8")
    # Read where they are through links in data/raw (allowed on purpose: DVC hashes the files
    # the links point to), not copied into the project.
    params = {"prepare": {"train": "sst2-train.tsv", "validation": "sst2-dev.tsv", "test": "",
                          "allow_outside": True},
              "model": {"name": "default", "init": "pretrained"},
              "train": {"epochs": 1, "lr": 1e-4, "global_batch_size": 32, "micro_batch_size": 32,
                        "eval_every": 0, "report_every": 50, "checkpoint_every": 1000},
              "ray": {"num_workers": 1, "cpus_per_worker": threads()}}
    make_project(tmp_path, params)
    (tmp_path / "data/raw/sst2-train.tsv").symlink_to(subset)
    (tmp_path / "data/raw/sst2-dev.tsv").symlink_to(SST2 / "dev.tsv")
    started = time.time()
    run(["dvc", "repro"], tmp_path, timeout=1800)
    seconds = time.time() - started
    metrics = json.loads((tmp_path / "data/eval/report.json").read_text())
    train = {**json.loads((tmp_path / "data/train/metrics.json").read_text()),
             **json.loads((tmp_path / "data/train/speed/metrics.json").read_text())}
    print(f"\nSST-2 dev accuracy {metrics['accuracy']:.4f}, macro-F1 {metrics['macro_f1']:.4f}; "
          f"train {train['train/seconds']:.0f} s for {train['train/rows']} rows "
          f"(padding efficiency {train['train/padding_efficiency']:.3f}); whole repro {seconds:.0f} s")
    assert metrics["split"] == "validation" and metrics["rows"] == 872
    assert train["train/rows"] == ROWS
    assert metrics["accuracy"] >= 0.80
    _, runs = mlflow_runs(tmp_path)
    assert runs[0].data.metrics["eval/accuracy"] == pytest.approx(metrics["accuracy"])
