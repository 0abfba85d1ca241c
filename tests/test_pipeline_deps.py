"""dvc.yaml's deps are true: a stage lists every wellfed module its script imports, transitively
(function-level imports included: they run too), plus the config package. Otherwise `dvc repro` would
call a stage "up to date" after its code changed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parents[1]
SRC = PROJECT / "src"


def module_file(name: str) -> Path | None:
    """src/ file of a `wellfed...` module name, or None when the name is not a module."""
    base = SRC.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(path: Path) -> set[str]:
    """Names of wellfed modules (and candidate submodules) one file imports, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n == "wellfed" or n.startswith("wellfed.")}


def is_trivial_init(path: Path) -> bool:
    """A package __init__ holding only a docstring and constants runs no code worth tracking."""
    if path.name != "__init__.py":
        return False
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(n, (ast.Expr, ast.Assign)) and not isinstance(getattr(n, "value", None), ast.Call)
               for n in body)


def import_closure(script: Path) -> set[Path]:
    """Every wellfed source file `script` can execute, relative to the project."""
    seen: set[Path] = set()
    todo = [script]
    while todo:
        for name in imported_modules(todo.pop()):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b too
                path = module_file(".".join(parts[:i]))
                if path and path not in seen:
                    seen.add(path)
                    todo.append(path)
    return {p.relative_to(PROJECT) for p in seen if not is_trivial_init(p)}


def missing_deps(stages: dict) -> dict[str, list[str]]:
    """stage -> wellfed files its script imports (plus the config package) that no dep covers."""
    missing = {}
    for name, stage in stages.items():
        stage = stage.get("do", stage)  # a `foreach` stage: its template
        script = re.search(r"python\s+(stages/\S+\.py)", stage["cmd"])
        if not script:
            continue
        deps = [Path(d) for d in stage.get("deps", [])]
        needed = import_closure(PROJECT / script.group(1)) | set(Path("src/wellfed/config").glob("*.py"))
        uncovered = sorted(str(p) for p in needed
                           if not any(p == d or d in p.parents for d in deps))
        if uncovered:
            missing[name] = uncovered
    return missing


def stages() -> dict:
    return yaml.safe_load((PROJECT / "dvc.yaml").read_text())["stages"]


def test_every_stage_lists_the_modules_it_imports():
    found = stages()
    assert len(found) == 6, sorted(found)
    missing = missing_deps(found)
    assert not missing, "; ".join(f"dvc.yaml stage {s!r} imports {', '.join(m)} but does not list "
                                  "it in deps: add it" for s, m in missing.items())


def test_the_check_catches_a_planted_missing_dep():
    planted = stages()
    planted["evaluate"]["deps"] = [d for d in planted["evaluate"]["deps"]
                                   if d != "src/wellfed/data/batching.py"]
    assert missing_deps(planted) == {"evaluate": ["src/wellfed/data/batching.py"]}
    planted["predict"]["do"]["deps"].remove("src/wellfed/cluster.py")  # a `foreach` stage too
    assert missing_deps(planted) == {"evaluate": ["src/wellfed/data/batching.py"],
                                     "predict": ["src/wellfed/cluster.py"]}


def test_the_closure_follows_function_level_and_transitive_imports():
    closure = import_closure(PROJECT / "stages" / "train.py")
    # driver imports the loop inside a function; the loop imports batching, which no stage names
    assert Path("src/wellfed/train/step/loop.py") in closure
    assert Path("src/wellfed/data/batching.py") in closure
    assert Path("src/wellfed/__init__.py") not in closure  # docstring + version only
