"""src/ uses only the public APIs of Ray, MLflow, DVC and scikit-learn: a private module or name
(`ray.train.v2._internal`, sklearn's `_approximate_mode`) is a pin on one release and a break on
the next, and Ray clients must match their cluster's version. Read from the source with `ast`:
imports anywhere in a file (function-level ones too) and attribute chains on imported names."""

from __future__ import annotations

import ast
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
WATCHED = ("ray", "mlflow", "dvc", "sklearn")

KNOWN: dict[str, set[str]] = {}
"""Private imports allowed, by file: none. The test fails on any private import, and on an entry
here that the file no longer imports (delete it then, so that it cannot come back unnoticed)."""


def private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def watched(name: str) -> bool:
    return name.split(".")[0] in WATCHED


def private_uses(source: str) -> set[str]:
    """Dotted names of the private modules and names of WATCHED packages a file imports, and of
    private attributes it reaches through an imported name (`ray._private.worker`)."""
    found, aliases = set(), {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if watched(alias.name):
                    if any(map(private, alias.name.split("."))):
                        found.add(alias.name)
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if watched(node.module):
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    if any(map(private, name.split("."))):
                        found.add(name)
                    aliases[alias.asname or alias.name] = name
    inner_links = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner_links:  # whole chains only
            parts, inner = [], node
            while isinstance(inner, ast.Attribute):
                parts.insert(0, inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in aliases and any(map(private, parts)):
                found.add(".".join([aliases[inner.id], *parts]))
    return found


def findings() -> dict[str, set[str]]:
    found = {}
    for path in sorted((PROJECT / "src").rglob("*.py")):
        uses = private_uses(path.read_text(encoding="utf-8"))
        if uses:
            found[path.relative_to(PROJECT).as_posix()] = uses
    return found


def test_src_imports_no_private_module_or_name_of_ray_mlflow_dvc_or_sklearn():
    found = findings()
    files = len(list((PROJECT / "src").rglob("*.py")))
    assert files > 40  # the walk saw the package
    new = {f: sorted(uses - KNOWN.get(f, set())) for f, uses in found.items()}
    new = {f: uses for f, uses in new.items() if uses}
    assert not new, "; ".join(f"{f} uses {', '.join(u)}: a private API; use the public one, or "
                              "write the small thing yourself and test it" for f, u in new.items())
    stale = {f: sorted(uses - found.get(f, set())) for f, uses in KNOWN.items()}
    stale = {f: uses for f, uses in stale.items() if uses}
    assert not stale, "; ".join(f"{f} no longer uses {', '.join(u)}: delete it from KNOWN"
                                for f, u in stale.items())


def test_the_check_sees_each_kind_of_private_use():
    source = """
import ray
import sklearn.utils._testing
import mlflow.utils as mu
from dvc._debug import x
from sklearn.utils.extmath import _approximate_mode, randomized_svd
from ray.train import Checkpoint
from ray.train.v2._internal.execution import context
from wellfed._private import fine
from . import _relative

def f():
    from mlflow.tracking._tracking_service import utils
    ray._private.worker.global_worker
    mu._get_store()
    ray.train.__file__
    Checkpoint._from_path
"""
    assert private_uses(source) == {
        "sklearn.utils._testing", "dvc._debug.x", "sklearn.utils.extmath._approximate_mode",
        "ray.train.v2._internal.execution.context", "mlflow.tracking._tracking_service.utils",
        "ray._private.worker.global_worker", "mlflow.utils._get_store",
        "ray.train.Checkpoint._from_path"}
    assert private_uses("import numpy._core\nfrom pandas._libs import lib\n") == set()
