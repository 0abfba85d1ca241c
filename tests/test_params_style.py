"""params.yaml is written the way `dvc exp run -S` writes it back, so that an experiment's diff is
its values only: DVC loads the file with ruamel.yaml, sets the values and dumps the whole file in
ruamel's default style (`""` comes back as `''`, a flow list `[a, b]` as a block list, a list's
trailing comment stranded). Run the real `dvc exp run -S` in a throwaway copy of the project and
read `git diff`: one key set changes one line, and every scalar key set changes its own line only,
its comment kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.committed import committed_text

# A stand-in pipeline: `dvc exp run` needs a stage to run, and how DVC writes params.yaml back does
# not depend on which stages there are.
STAND_IN = """stages:
  noop:
    cmd: python -c "pass"
    params:
      - train.lr
"""


def run(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "DO_NOT_TRACK": "1", "DVC_NO_ANALYTICS": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """A git + DVC repository holding the project's params.yaml and the stand-in pipeline."""
    (tmp_path / "params.yaml").write_text(committed_text("params.yaml"))  # git's, not the
    # workspace's: an experiment the user ran leaves its values there
    (tmp_path / "dvc.yaml").write_text(STAND_IN)
    dvc = str(Path(sys.executable).with_name("dvc"))
    run(["git", "init", "-q"], tmp_path)
    run([dvc, "init", "-q"], tmp_path)
    run([dvc, "config", "core.analytics", "false"], tmp_path)
    run(["git", "add", "-A"], tmp_path)
    run(["git", "commit", "-qm", "project"], tmp_path)
    return tmp_path


def exp_run(repo: Path, overrides: list[str]) -> list[tuple[str, str]]:
    """`dvc exp run -S ...` in `repo`; the (old, new) pairs of params.yaml's changed lines, which
    must be as many on each side and in the same places (nothing added, dropped or moved)."""
    dvc = str(Path(sys.executable).with_name("dvc"))
    before = (repo / "params.yaml").read_text().splitlines()
    run([dvc, "exp", "run", *(a for o in overrides for a in ("-S", o))], repo)
    after = (repo / "params.yaml").read_text().splitlines()
    diff = run(["git", "diff", "--numstat", "--", "params.yaml"], repo).split()
    assert len(before) == len(after), f"DVC rewrote params.yaml's layout: {diff}"
    return [(old, new) for old, new in zip(before, after) if old != new]


@pytest.mark.integration
def test_setting_one_key_changes_one_line(project_copy):
    changed = exp_run(project_copy, ["train.lr=2e-4"])
    assert changed == [("  lr: 1.0e-4                # peak AdamW lr (MiniLM on SST-2: 1e-4 at batch 32 "
                        "reached 0.877 in 20k rows)",
                        "  lr: 0.0002                # peak AdamW lr (MiniLM on SST-2: 1e-4 at batch 32 "
                        "reached 0.877 in 20k rows)")]
    numstat = run(["git", "diff", "--numstat", "--", "params.yaml"], project_copy).split()
    assert numstat == ["1", "1", "params.yaml"]


def other_value(value):
    """A value of the same type that differs, written as a Hydra override."""
    if isinstance(value, bool):
        return str(not value).lower()
    if isinstance(value, int):
        return str(value + 1)
    if isinstance(value, float):
        return repr(value / 2)
    assert value != "other"
    return "other"  # plain: a comma would make it a Hydra sweep


@pytest.mark.integration
def test_setting_every_scalar_key_changes_its_own_line_and_keeps_its_comment(project_copy):
    params = yaml.safe_load(committed_text("params.yaml"))
    scalars = {f"{section}.{key}": value for section, keys in params.items()
               for key, value in keys.items() if not isinstance(value, (list, dict))}
    assert len(scalars) >= 60
    changed = exp_run(project_copy, [f"{key}={other_value(value)}" for key, value in scalars.items()])
    # each changed line is its key's, with the new value; the comment after it is unchanged
    names = sorted(old.split(":")[0].strip() for old, _ in changed)
    assert names == sorted(key.split(".")[1] for key in scalars)
    for old, new in changed:
        assert old.split(":")[0] == new.split(":")[0]
        assert old.partition("#")[2] == new.partition("#")[2], f"{old!r} -> {new!r}"
    # the lists and mappings, not set, come back as they were (checked by the equal line counts
    # and by being absent from `changed`)
