"""A training run's MLflow page as a newcomer meets it: a few tags (what people filter, search and
group runs by), then the description that leads with the headline figures; the rest of what the
run records is in one artifact, its details (track/run_details.py). The four stages run as
`dvc repro` runs them (their dvc.yaml commands), without DVC: a tiny model, four steps, one
in-process worker."""

from __future__ import annotations

import pytest

from tests.e2e.pipeline import mlflow_runs, run, tiny_project
from wellfed.track import run_details, worker_metrics

STAGES = ("python stages/prepare.py data/raw data/prepared data/reports/prepare.json",
          "python stages/tokenize_text.py data/prepared data/tokens data/reports/tokens.json",
          "python stages/train.py data/tokens data/model data/train data/checkpoints",
          "python stages/evaluate.py data/tokens data/model data/train/run.json "
          "data/train/validation_outputs.npz data/eval")

EVERY_RUN = {"wellfed.run_key", "git.dirty", "derived.precision", "derived.world_size",
             "derived.engine", "derived.devices"}
"""The tags every training run has: the run's checkpoint folder (found by it), whether its code
was committed, and what wellfed decided that runs are compared by (precision, workers, engine,
hardware)."""
SHOWN_AT_MOST = 8
"""The bound on the tags the run page shows (MLflow hides its own `mlflow.*`): EVERY_RUN's 6, and
room for the two a run commonly adds, `wellfed.alias` on the champion's run and `dvc.exp_name`
under `dvc exp run` (`git.changed` on uncommitted code, a sweep's, search's or lost node's tags
come on rarer runs). Before issue #43 a single-worker run showed 28 (26 here, outside DVC)."""


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir):
    dest = tiny_project(tmp_path_factory.mktemp("run-page"), tiny_model_dir)
    for command in STAGES:
        run(command.split(), dest)
    return dest


def test_a_training_run_shows_a_few_tags_and_leads_with_its_headline(project):
    client, runs = mlflow_runs(project)
    assert len(runs) == 1
    tags, metrics = runs[0].data.tags, runs[0].data.metrics
    shown = sorted(k for k in tags if not k.startswith("mlflow."))
    assert len(shown) <= SHOWN_AT_MOST, shown
    assert set(shown) == EVERY_RUN | {"wellfed.alias"}, shown  # the only version: the champion
    headline = [f"eval/{k}" for k in ("accuracy", "macro_f1", "ece")]
    assert all(key in metrics for key in headline), sorted(metrics)
    note = tags["mlflow.note.content"]
    first = note.splitlines()[0]
    assert first == (f"### eval/accuracy {metrics['eval/accuracy']:.4f} · **eval/macro_f1 "
                     f"{metrics['eval/macro_f1']:.4f}** · eval/ece {metrics['eval/ece']:.4f} on "
                     "test (30 rows)"), note


def test_what_left_the_tags_is_in_the_run_details_and_its_description(project):
    client, runs = mlflow_runs(project)
    run_id, tags = runs[0].info.run_id, runs[0].data.tags
    details = run_details.read(f"sqlite:///{project / 'mlflow.db'}", run_id)
    assert details["derived"]["precision_reason"].startswith("auto: CPU")
    assert details["derived"]["accumulation_steps"] == 1 and details["derived"]["use_gpu"] is False
    assert details["derived"]["peak_source"].startswith("estimate:")
    assert details["run_hash"].startswith(tags["wellfed.run_key"].removeprefix("wf-"))
    assert details["versions"]["python"].count(".") == 2 and "torch" in details["versions"]
    assert details["diagnosis"].startswith("Bottleneck: ")
    assert details["calibration"].startswith("temperature ")
    assert details["worker_seconds"]["steps"] > 0  # the loop's seconds, moved off the tag
    assert worker_metrics.WORKER_TIME not in tags
    note = tags["mlflow.note.content"]
    for line in (f"- **diagnosis** {details['diagnosis']}",
                 f"- **precision** fp32 ({details['derived']['precision_reason']})",
                 f"- **calibration** {details['calibration']}", f"`{run_details.ARTIFACT}`"):
        assert line in note, note
