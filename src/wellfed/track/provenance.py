"""Where a run came from, as MLflow records it: the git commit, the library versions, DVC's
experiment name; and what must never reach MLflow (credentials)."""

from __future__ import annotations

import fnmatch
import getpass
import os
import posixpath
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

SECRET_PATTERN = re.compile(r"(token|secret|password|passwd|api[_-]?key|credential|aws_)", re.I)
# Values that look like credentials whatever their key: HF, GitHub, OpenAI-style, AWS key ids,
# and user:password@ in URIs.
SECRET_VALUE = re.compile(r"(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}"
                          r"|AKIA[0-9A-Z]{16}|://[^/\s:@]+:[^/\s@]+@)")


def scrub(params: dict[str, Any]) -> dict[str, Any]:
    """Never let a credential reach MLflow: drop secret-looking keys, redact secret-looking values."""
    return {k: redact(v) for k, v in params.items() if not SECRET_PATTERN.search(k)}


def redact(value: Any) -> Any:
    """`value`, or `<redacted>` where it looks like it holds a secret (a password in a URI)."""
    return "<redacted>" if SECRET_VALUE.search(str(value)) else value


def git_tags(root: Path) -> dict[str, str]:
    """Whether the code that ran is its commit's (`git.dirty`, and `git.changed`: the files
    that differ), MLflow's source keys (the commit is `mlflow.source.git.commit`, which the run
    page shows beside the source: no second tag repeats it) and the DVC experiment's name."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD")
    changed = code_changes(git("diff", "--name-only", "--relative", "-z", "HEAD").split("\0"),
                           pipeline_outputs(root))
    tags = {"git.dirty": str(bool(changed)).lower() if commit else "unknown",
            # MLflow's own keys: the UI's Source and Created by columns read them.
            "mlflow.source.type": "LOCAL", "mlflow.source.name": "stages/train.py (dvc repro)",
            "mlflow.user": getpass.getuser()}
    if changed:
        more = f" and {len(changed) - SHOWN_CHANGES} more" if len(changed) > SHOWN_CHANGES else ""
        tags["git.changed"] = ", ".join(changed[:SHOWN_CHANGES]) + more
    if commit:
        tags["mlflow.source.git.commit"] = commit
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc.exp_name"] = os.environ["DVC_EXP_NAME"]
    return tags


SHOWN_CHANGES = 10  # git.changed names this many files, then counts the rest
RUN_RECORDS = ("dvc.lock", "params.yaml")
"""Tracked files that differ from the commit on every run without the code changing: DVC
rewrites dvc.lock after each stage, and `dvc exp run -S` edits params.yaml, whose every value
the run records as its params."""


def pipeline_outputs(root: Path) -> list[str]:
    """Every `outs`, `metrics` and `plots` path of root/dvc.yaml's stages, as globs (a
    `foreach` stage's `${key}` matches anything): the files the stages rewrite before train."""
    import yaml

    try:
        stages = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return []
    found = []
    for stage in stages.values():
        stage = stage.get("do", stage) if isinstance(stage, dict) else {}
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind) or []:
                path = next(iter(entry)) if isinstance(entry, dict) else str(entry)
                found.append(re.sub(r"\$\{[^}]*\}", "*", path).rstrip("/"))
    return found


def code_changes(paths: list[str], outputs: list[str]) -> list[str]:
    """The changed `paths` (git's, relative to the root) that are not the pipeline's own
    outputs (files, files under output folders, and the .gitignore DVC keeps beside each) nor
    RUN_RECORDS."""
    def output(path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, out) or path.startswith(out + "/")
                   or path == posixpath.join(posixpath.dirname(out), ".gitignore")
                   for out in outputs)

    return [p for p in paths if p and p not in RUN_RECORDS and not output(p)]


def library_versions() -> dict[str, str]:
    """{"python": "3.11.7", "torch": "2.13.0+cpu", ...}: Python's and the main libraries'
    versions, for the run's details (track/run_details.py; not tags: nobody filters by them)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "tokenizers", "pyarrow", "ray", "mlflow", "dvc"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found
