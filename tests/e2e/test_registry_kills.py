"""The registry's two weak points, killed for real (SIGKILL, tests/e2e/killer) on the pipeline as
a user runs it (tiny random-init BERT, one worker in-process, real DVC and MLflow): a short
baseline holds `@champion`; a long experiment's train stage dies just after registering its
version, the rerun dies in evaluate just after moving the alias, and the third try finishes.
Then the run has one version, and the champion's words are its own."""

from __future__ import annotations

import os

import pytest

from tests.e2e.pipeline import PROJECT, env, make_project, mlflow_runs
from tests.e2e.test_story import NAME, PARAMS, ROWS
from wellfed.track import champion, registry

pytestmark = pytest.mark.e2e

KILLER = PROJECT / "tests" / "e2e" / "killer"
EXPERIMENT = ["dvc", "exp", "run", "-S", "train.max_steps=0"]  # 6 epochs: beats 3 steps


def run_killed(cmd: list[str], cwd, kill: str | None = None):
    """`cmd` in the project, with the stage call `kill` (killer/sitecustomize.py) fatal."""
    import subprocess

    environ = env()
    if kill:
        environ.update(WELLFED_KILL=kill, WELLFED_KILL_MARK=str(cwd / f"killed-{len(kill)}"),
                       PYTHONPATH=os.pathsep.join([str(KILLER), environ.get("PYTHONPATH", "")]))
    return subprocess.run(cmd, cwd=cwd, env=environ, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory, tiny_model_dir):
    dest = tmp_path_factory.mktemp("kills")
    make_project(dest, {**PARAMS, "model": {"name": str(tiny_model_dir), "init": "random"}}, ROWS)
    consoles = []
    for cmd, kill in ((["dvc", "repro"], None),
                      (EXPERIMENT, "stages/train.py:wellfed.track.registry:register"),
                      (EXPERIMENT, "stages/evaluate.py:mlflow:MlflowClient."
                                   "set_registered_model_alias"),
                      (EXPERIMENT, None)):
        done = run_killed(cmd, dest, kill)
        consoles.append(done.stdout + done.stderr)
        assert (done.returncode != 0) == bool(kill), consoles[-1][-4000:]
        if kill:
            assert (dest / f"killed-{len(kill)}").is_file(), consoles[-1][-4000:]
    return dest, consoles


def test_the_rerun_of_a_run_killed_after_registering_keeps_one_version(killed_twice):
    dest, consoles = killed_twice
    client, runs = mlflow_runs(dest)
    assert len(runs) == 2  # the baseline, and the experiment resumed twice into one run
    versions = {str(v.version): v for v in client.search_model_versions(f"name = '{NAME}'")}
    assert sorted(versions) == ["1", "3"]  # version 2, the killed attempt's, is gone
    assert versions["3"].run_id == runs[1].info.run_id
    assert f"[wellfed] removed version 2 of {NAME}: an interrupted attempt" in consoles[2]
    models = client.search_logged_models([runs[1].info.experiment_id],
                                         f"source_run_id = '{runs[1].info.run_id}'")
    assert [m.model_id for m in models] == [registry.model_id_of(versions["3"])]


def test_killed_after_moving_the_alias_the_rerun_gives_the_champion_its_words(killed_twice):
    dest, consoles = killed_twice
    client, _ = mlflow_runs(dest)
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "3"
    v1, v3 = (client.get_model_version(NAME, v) for v in ("1", "3"))
    values = [float(v.tags[registry.VALUE]) for v in (v1, v3)]
    assert values[1] > values[0]
    reason = (f"@champion: eval/macro_f1 {values[1]:.4f} on the test split beats version 1's "
              f"{values[0]:.4f} on the same split")
    assert v3.tags[registry.REASON] == reason
    assert v3.description == champion.description(champion.scored(v3), reason, "champion")
    assert v1.tags[registry.REASON].startswith("not @champion: ") and v1.description == \
        champion.description(champion.scored(v1), v1.tags[registry.REASON], "champion")
    assert f"[wellfed] models:/{NAME}@champion stays version 3: {reason.split(': ', 1)[1]}" \
        in consoles[3]


def test_killed_in_evaluate_the_rerun_logs_its_figures_once(killed_twice):
    """The second try died in evaluate after logging eval/* (it moves the alias after); the
    third logged the same figures of the same model: each is in the run once, at step 0."""
    dest, _ = killed_twice
    client, runs = mlflow_runs(dest)
    keys = [k for k in runs[1].data.metrics if k.startswith("eval/")]
    assert len(keys) >= 3, keys
    for key in keys:
        history = client.get_metric_history(runs[1].info.run_id, key)
        assert [m.step for m in history] == [0], (key, history)
