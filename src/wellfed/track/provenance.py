"""Where a run came from, as MLflow records it: the git commit, the library versions, DVC's
experiment name; and what must never reach MLflow (credentials)."""

from __future__ import annotations

import getpass
import os
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
    return {k: ("<redacted>" if SECRET_VALUE.search(str(v)) else v)
            for k, v in params.items() if not SECRET_PATTERN.search(k)}


def git_tags(root: Path) -> dict[str, str]:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD")
    tags = {"git.commit": commit or "unknown",
            "git.dirty": str(bool(git("status", "--porcelain", "--untracked-files=no"))).lower(),
            # MLflow's own keys: the UI's Source and Created by columns read them.
            "mlflow.source.type": "LOCAL", "mlflow.source.name": "stages/train.py (dvc repro)",
            "mlflow.user": getpass.getuser()}
    if commit:
        tags["mlflow.source.git.commit"] = commit
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc.exp_name"] = os.environ["DVC_EXP_NAME"]
    return tags


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "tokenizers", "pyarrow", "ray", "mlflow", "dvc"):
        try:
            out[f"version.{name}"] = version(name)
        except PackageNotFoundError:
            pass
    return out
