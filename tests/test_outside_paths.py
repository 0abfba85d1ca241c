"""Files params.yaml names are read inside the folder the pipeline gives (prepare: the raw
folder; the predict stage: the project) unless `allow_outside` says otherwise on purpose: a
link out, a `..` or an absolute path elsewhere is refused before a byte of it is read, in one
line naming the key and the fix, and no message carries the refused file's content."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import PROJECT
from tests.test_serving import save_model

GOOD = "sentence\tlabel\n" + "".join(f"good film {i}\t{i % 2}\n" for i in range(20))
SECRET = "SECRET-first-line\tlabel\n" + "".join(f"secret row {i}\t{i % 2}\n" for i in range(20))
ONLY = {"validation": "", "test": ""}


def prepare(tmp_path, params: dict) -> subprocess.CompletedProcess:
    """The prepare stage in tmp_path/project, raw folder `data/raw` as dvc.yaml passes it."""
    project = tmp_path / "project"
    (project / "params.yaml").write_text(yaml.safe_dump({"prepare": params}))
    return subprocess.run([sys.executable, str(PROJECT / "stages" / "prepare.py"), "data/raw",
                           "data/prepared", "data/reports/prepare.json"], cwd=project,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def layout(tmp_path):
    """tmp_path/project/data/raw/train.tsv (good) and tmp_path/outside/secret.tsv (a readable,
    valid file outside the project whose first line must never be shown)."""
    raw = tmp_path / "project" / "data" / "raw"
    raw.mkdir(parents=True)
    (raw / "train.tsv").write_text(GOOD)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.tsv").write_text(SECRET)
    return tmp_path


def refused(proc, line: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {line}"]
    assert "SECRET" not in proc.stdout + proc.stderr and "root:" not in proc.stderr
    assert proc.stdout == ""


def test_a_link_in_the_raw_folder_to_a_file_outside_is_refused_unread(layout):
    raw = layout / "project" / "data" / "raw"
    (raw / "secret.tsv").symlink_to(layout / "outside" / "secret.tsv")
    (raw / "passwd").symlink_to("/etc/passwd")
    proc = prepare(layout, {**ONLY, "train": "secret.tsv"})
    refused(proc, f"prepare.train 'secret.tsv' is a link to {layout / 'outside' / 'secret.tsv'}, "
                  "outside the raw folder data/raw; put the file itself in data/raw, or set "
                  "prepare.allow_outside: true to read it where it is")
    proc = prepare(layout, {**ONLY, "train": "passwd", "header": False})
    refused(proc, "prepare.train 'passwd' is a link to /etc/passwd, outside the raw folder "
                  "data/raw; put the file itself in data/raw, or set prepare.allow_outside: "
                  "true to read it where it is")
    assert not (layout / "project" / "data" / "prepared").exists()


def test_a_dotdot_or_absolute_path_outside_is_refused_and_every_split_is_named(layout):
    proc = prepare(layout, {**ONLY, "train": "../../../../../../../../etc/passwd"})
    refused(proc, "prepare.train '../../../../../../../../etc/passwd' is outside the raw folder "
                  "data/raw; put the file in data/raw and name it there, or set "
                  "prepare.allow_outside: true to read it where it is")
    secret = str(layout / "outside" / "secret.tsv")
    proc = prepare(layout, {"train": "train.tsv", "validation": "../../../outside/secret.tsv",
                            "test": secret})
    refused(proc, "prepare.validation '../../../outside/secret.tsv' is outside the raw folder "
                  "data/raw; put the file in data/raw and name it there, or set "
                  "prepare.allow_outside: true to read it where it is; prepare.test "
                  f"'{secret}' is outside the raw folder data/raw; put the file in data/raw "
                  "and name it there, or set prepare.allow_outside: true to read it where it is")


def test_inside_the_raw_folder_links_and_absolute_paths_are_read(layout):
    raw = layout / "project" / "data" / "raw"
    (raw / "copy.tsv").symlink_to("train.tsv")  # a link that stays inside
    (raw / "sub").mkdir()
    (raw / "sub" / "dev.tsv").symlink_to("../train.tsv")
    proc = prepare(layout, {"train": "copy.tsv", "validation": "sub/../sub/dev.tsv",
                            "test": str(raw / "train.tsv")})
    assert proc.returncode == 0, proc.stderr
    assert "outside" not in proc.stderr


def test_allow_outside_reads_it_and_warns_when_dvc_does_not_track_it(layout):
    raw = layout / "project" / "data" / "raw"
    secret = layout / "outside" / "secret.tsv"
    (raw / "linked.tsv").symlink_to(secret)
    proc = prepare(layout, {"train": str(secret), "validation": "linked.tsv", "test": "",
                            "allow_outside": True, "text_column": 0, "label_column": 1})
    assert proc.returncode == 0, proc.stderr
    warning = (f"prepare.train reads {secret}, outside the raw folder data/raw "
               "(prepare.allow_outside: true): DVC does not track it, so a change to it does not "
               "rerun prepare; name a link to it in data/raw instead (DVC hashes what a link "
               "points to), or run `dvc repro -f prepare` after changing it")
    assert f"[wellfed] warning: {warning}" in proc.stderr.splitlines()
    assert "prepare.validation" not in proc.stderr  # a link in data/raw: DVC hashes its target
    report = json.loads((layout / "project" / "data" / "reports" / "prepare.json").read_text())
    assert warning in report["warnings"]
    assert report["splits"]["train"]["rows_read"] == 20


def test_a_nul_in_a_path_is_named_before_the_os_refuses_it(layout):
    proc = prepare(layout, {**ONLY, "train": "train\x00.tsv"})
    refused(proc, "prepare.train 'train\\x00.tsv' holds a NUL character; name the file without it")


# ---------------------------------------------------------------- the predict stage


@pytest.fixture(scope="module")
def model(tiny_model_dir, tmp_path_factory):
    return save_model(tiny_model_dir, tmp_path_factory.mktemp("model"), ["no", "yes"],
                      "single_label_classification")


def predict_stage(project: Path, model: Path, name: str, inputs: dict,
                  **params) -> subprocess.CompletedProcess:
    """The predict stage as DVC runs `predict@<name>`: its name in $DVC_STAGE."""
    (project / "params.yaml").write_text(yaml.safe_dump({"predict": {"inputs": inputs,
                                                                     **params}}))
    env = {**os.environ, "DVC_STAGE": f"predict@{name}"}
    return subprocess.run([sys.executable, str(PROJECT / "stages" / "predict.py"), str(model),
                           "data/predictions"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.integration
def test_the_predict_stage_reads_inside_the_project_only_unless_allowed(layout, model):
    project = layout / "project"
    (project / "new.csv").write_text("sentence\na fine film\nbad .\n")
    (project / "out.csv").symlink_to(layout / "outside" / "secret.tsv")
    secret = layout / "outside" / "secret.tsv"
    for value, what in (("out.csv", f"is a link to {secret}, outside the project"),
                        ("../outside/secret.tsv", "is outside the project"),
                        (str(secret), "is outside the project"),
                        ("/etc/passwd", "is outside the project")):
        proc = predict_stage(project, model, "x", {"x": value})
        put = "put the file itself in" if "link" in what else "put the file in"
        name = " and name it there" if "link" not in what else ""
        refused(proc, f"predict.inputs.x {value!r} {what}; {put} the project{name}, or set "
                      "predict.allow_outside: true to read it where it is")
        assert not (project / "data" / "predictions").exists()
    proc = predict_stage(project, model, "gone", {"gone": "data/gone.csv"})
    refused(proc, "data/gone.csv: input file not found; check predict.inputs (or "
                  "wellfed-predict's INPUT)")
    proc = predict_stage(project, model, "ok", {"ok": "new.csv"})
    assert proc.returncode == 0, proc.stderr
    assert len(pd.read_parquet(project / "data" / "predictions" / "ok.parquet")) == 2
    proc = predict_stage(project, model, "far", {"far": str(secret)}, allow_outside=True,
                         text_column=0)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr  # the stage's dep is the file: DVC tracks it anyway
    assert len(pd.read_parquet(project / "data" / "predictions" / "far.parquet")) == 20
