"""Stage scripts as a user runs them: bad input -> exit 1, one line naming the problem, no outputs."""

import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import PROJECT, write_tsv


def run_prepare(tmp_path: Path, prepare_params: dict):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"prepare": prepare_params}))
    return subprocess.run([sys.executable, str(PROJECT / "stages" / "prepare.py"), "raw", "prepared",
                           "reports/prepare.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def test_prepare_writes_splits_labels_and_report(tmp_path):
    rows = [(f"good {i}", "pos") if i % 2 else (f"bad {i}", "neg") for i in range(40)]
    write_tsv(tmp_path / "raw" / "train.tsv", rows)
    proc = run_prepare(tmp_path, {"validation": "", "test": ""})
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "prepared").iterdir()) == [
        "labels.json", "train.parquet", "validation.parquet"]
    assert (tmp_path / "reports" / "prepare.json").is_file()


def test_bad_input_is_one_line_exit_1_and_leaves_nothing(tmp_path):
    write_tsv(tmp_path / "raw" / "train.tsv", [("x", "1"), ("", "0")])
    cases = [({"validation": "", "test": "", "text_column": "sentense"}, "did you mean 'sentence'"),
             ({"validation": "nope.tsv", "test": ""}, "raw/nope.tsv: raw data file not found"),
             ({"validation": "", "test": ""}, "data row 2 has empty text"),
             ({"validation": "", "tset": ""}, "unknown key 'prepare.tset' (did you mean 'prepare.test'?)")]
    for params, message in cases:
        proc = run_prepare(tmp_path, params)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
        assert not (tmp_path / "prepared").exists() and not (tmp_path / "reports").exists()
        leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
        assert leftovers == []
    assert len(cases) == 4
