"""One source of defaults: params.yaml lists every key the config knows, each with a comment,
and its values are the dataclass defaults (so a key left out of a user's params.yaml means what
the project's params.yaml says)."""

from __future__ import annotations

import dataclasses
import subprocess

import yaml

from tests.committed import committed_params, committed_text
from wellfed.config import SECTIONS, load_params


def default(field: dataclasses.Field):
    """A field's default; a mapping or list default is made by its factory."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def test_params_yaml_lists_every_key_with_the_dataclass_default(tmp_path):
    params = committed_params(tmp_path)  # git's copy: `dvc exp run -S` rewrites the workspace's
    loaded = dict(zip(SECTIONS, load_params(params, *SECTIONS)))
    raw = yaml.safe_load(params.read_text())
    problems, checked = [], 0
    for name, cls in SECTIONS.items():
        for field in dataclasses.fields(cls):
            checked += 1
            if field.name not in raw.get(name, {}):
                problems.append(f"{name}.{field.name} is missing from params.yaml")
            elif getattr(loaded[name], field.name) != default(field):
                problems.append(f"{name}.{field.name}: params.yaml says "
                                f"{getattr(loaded[name], field.name)!r}, the config dataclass {default(field)!r}")
    assert checked >= 40
    assert not problems, "; ".join(problems)


def test_every_params_yaml_key_has_a_comment():
    uncommented = []
    section = None
    for line in committed_text("params.yaml").splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "- ")):
            continue  # a comment, or a list's item (its key's comment is above the items)
        if not line.startswith(" "):
            section = line.split(":")[0]
        elif "#" not in line:
            uncommented.append(f"{section}.{line.split(':')[0].strip()}")
    assert not uncommented, f"params.yaml keys without a comment: {uncommented}"


def test_the_committed_params_yaml_is_read_not_the_workspaces(tmp_path):
    """After `dvc exp run -S train.lr=...` the workspace's params.yaml differs from git's; the
    tests above read git's (and the file itself outside a git checkout)."""
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                       check=True, capture_output=True)

    (tmp_path / "params.yaml").write_text("train:\n  lr: 1.0e-4\n")
    assert committed_text("params.yaml", tmp_path) == "train:\n  lr: 1.0e-4\n"  # no git yet
    git("init", "-q")
    git("add", "params.yaml")
    git("commit", "-qm", "params")
    (tmp_path / "params.yaml").write_text("train:\n  lr: 0.0002\n")  # as an experiment leaves it
    assert committed_text("params.yaml", tmp_path) == "train:\n  lr: 1.0e-4\n"
