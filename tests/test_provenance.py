"""`git.dirty` says whether the code that ran is the commit's: the stages' own outputs, dvc.lock
and params.yaml (every value of it is a run param) change on every run and do not count."""

import shutil
import subprocess
from pathlib import Path

from tests.conftest import PROJECT
from wellfed.track.provenance import code_changes, git_tags, pipeline_outputs


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=root,
                   check=True, capture_output=True)


def test_pipeline_outputs_are_every_out_metric_and_plot_of_dvc_yaml():
    outs = pipeline_outputs(PROJECT)
    for path in ("data/prepared", "data/tokens", "data/model", "data/train/metrics.json",
                 "data/train/history/steps.csv", "data/eval/confusion.csv",
                 "data/predictions/*.parquet"):
        assert path in outs, path
    assert "data/raw" not in outs and len(outs) == 17  # the inputs are not outputs
    # what differs on every run is not an output (gitignored: git status never shows it)
    assert "data/reports/time/train.json" not in outs and "data/train/run.json" not in outs
    assert "data/checkpoints" not in outs  # the run's resume state: a clone without it is up to date


def test_code_changes_leave_out_outputs_their_gitignore_and_run_records():
    outs = ["data/eval/metrics.json", "data/train/plots", "data/predictions/*.parquet"]
    paths = ["data/eval/metrics.json", "data/train/plots/loss.png", "data/eval/.gitignore",
             "data/predictions/new.parquet", "dvc.lock", "params.yaml", "",
             "src/wellfed/model.py", "data/raw/train.tsv", "data/train/plots.md"]
    assert code_changes(paths, outs) == ["src/wellfed/model.py", "data/raw/train.tsv",
                                         "data/train/plots.md"]


def test_git_dirty_is_false_after_the_stages_rewrite_outputs_and_true_for_code(tmp_path):
    shutil.copy(PROJECT / "dvc.yaml", tmp_path / "dvc.yaml")
    files = {"params.yaml": "train:\n  lr: 0.1\n", "dvc.lock": "schema: '2.0'\n",
             "src/wellfed/model.py": "x = 1\n", "data/eval/metrics.json": "{}\n",
             "data/eval/.gitignore": "/predictions.parquet\n",
             "data/train/history/steps.csv": "step,loss\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "a project")
    assert git_tags(tmp_path)["git.dirty"] == "false"
    for name in files:  # what `dvc repro` and `dvc exp run -S` rewrite before train starts
        if not name.startswith("src/"):
            (tmp_path / name).write_text(files[name] + "# rewritten\n")
    tags = git_tags(tmp_path)
    assert tags["git.dirty"] == "false" and "git.changed" not in tags, tags
    (tmp_path / "src/wellfed/model.py").write_text("x = 2\n")
    tags = git_tags(tmp_path)
    assert tags["git.dirty"] == "true" and tags["git.changed"] == "src/wellfed/model.py"
    assert len(tags["mlflow.source.git.commit"]) == 40 and "git.commit" not in tags


def test_what_differs_on_every_run_is_gitignored_and_no_dvc_output():
    """Each stage's seconds, train's speed reports, this machine's MLflow run and the
    checkpoints change on every run: committed, or recorded in dvc.lock, they left a fresh
    clone's `make run` with a modified tree. What is committed is what reproduces."""
    per_run = ["data/reports/time/train.json", "data/train/speed/metrics.json",
               "data/train/speed/diagnosis.md", "data/train/speed/plots/x.png",
               "data/train/run.json", "data/checkpoints/wf-1/model.pt"]
    ignored = subprocess.run(["git", "check-ignore", *per_run], cwd=PROJECT, capture_output=True,
                             text=True).stdout.split()
    assert ignored == per_run
    outs = pipeline_outputs(PROJECT)
    assert code_changes(per_run, outs) == per_run  # no output of dvc.yaml covers one of them
    committed = ["data/train/metrics.json", "data/train/history/steps.csv",
                 "data/train/plots/loss.png", "data/eval/metrics.json"]
    assert subprocess.run(["git", "check-ignore", *committed], cwd=PROJECT,
                          capture_output=True).returncode == 1  # none of them ignored
