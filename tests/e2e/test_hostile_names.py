"""No params value reaches a shell: DVC runs a stage's command through one, so every value
dvc.yaml interpolates (`predict.inputs`: each key and each file) is tried with shell syntax
that would create a file if it ran. None appears; a hostile name is refused in one line naming
it, by `dvc repro predict` and `dvc repro -s predict@<name>` alike (which do not run `check`);
a hostile file name is just a file name."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
import yaml

from tests.e2e.pipeline import run, tiny_project
from tests.test_serving import save_model

pytestmark = pytest.mark.e2e

# Each would create a file named PWNED_<something> in the project if a shell expanded it.
SHELL = ["$(touch${IFS}PWNED_DOLLAR)", "`touch PWNED_TICK`", "';touch PWNED_SQ;'",
         '";touch PWNED_DQ;"', ";touch PWNED_SEMI", "\\\";touch PWNED_ESC;\\\"",
         "'\"$(touch${IFS}PWNED_MIX)\"'", "|touch PWNED_PIPE", "&touch PWNED_AMP&"]


def pwned(project) -> list[str]:
    return sorted(str(p.relative_to(project)) for p in project.rglob("PWNED*"))


def set_inputs(project, inputs: dict) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["predict"]["inputs"] = inputs
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_no_key_or_file_of_predict_inputs_reaches_a_shell(tmp_path, tiny_model_dir):
    # The predict stages alone (`--single-item`), on a model put where the train stage leaves
    # it: what is tested is how each input is named and read, not a model trained upstream
    project = tiny_project(tmp_path, tiny_model_dir)
    model = save_model(tiny_model_dir, tmp_path / "m", ["no", "yes"],
                       "single_label_classification")
    shutil.copytree(model, project / "data" / "model")  # as the train stage leaves it

    # Every hostile string as a file name: the stage reads that file, nothing runs.
    files = {f"f{i}": f"data/new{text}.csv" for i, text in enumerate(SHELL)}
    for path in files.values():
        (project / path).write_text("sentence\na fine film\nbad .\n")
    set_inputs(project, files)
    proc = run(["dvc", "repro", "--single-item", "predict"], project)
    assert pwned(project) == [], proc.stdout
    for name, path in files.items():
        assert f"predict: 2 rows of {path} -> data/predictions/{name}.parquet" in proc.stdout
        assert len(pd.read_parquet(project / "data" / "predictions" / f"{name}.parquet")) == 2

    # Every hostile string as a name: refused, naming it, by every way of running the stages.
    names = {f"x{text}": "data/new.csv" for text in SHELL}
    (project / "data" / "new.csv").write_text("sentence\na fine film\n")
    set_inputs(project, names)
    listed = run(["dvc", "stage", "list", "--name-only"], project).stdout.splitlines()
    assert len([s for s in listed if s.startswith("predict@")]) == len(SHELL)
    for name in names:
        proc = run(["dvc", "repro", "-s", f"predict@{name}"], project, check=False)
        assert proc.returncode != 0
        assert f"predict.inputs name {name!r} names a stage and a file: use letters, digits, _ " \
               "and - only" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        assert pwned(project) == [], proc.stdout + proc.stderr
    proc = run(["dvc", "repro", "predict"], project, check=False)
    assert proc.returncode != 0 and "names a stage and a file" in proc.stdout + proc.stderr
    assert pwned(project) == []
