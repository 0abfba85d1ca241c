"""Imports flow one way: no module of src/wellfed imports one that imports it back, directly or
through others, and train/'s sub-packages import each other in the one direction docs/layout.md
draws. Read from the source with `ast`: every import counts, top-level, inside a function or
under TYPE_CHECKING alike (an import moved into a function to dodge a circle is still one)."""

from __future__ import annotations

import ast
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]

TRAIN_DIRECTION = {
    "run": {"step", "checkpoints", "outputs"},
    "trials": {"step", "checkpoints"},
    "outputs": {"checkpoints"},
    "step": {"checkpoints"},
    "checkpoints": set(),
}
"""What each sub-package of wellfed.train may import (docs/layout.md, "Imports flow one way")."""


def module_names(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under src/ (a package by its __init__)."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(src: Path) -> dict[str, set[str]]:
    """module -> the modules of src/ it imports. `from a import b` is an import of a.b when that
    is a module, else of a; a module's own packages are left out (they run before it anyway)."""
    modules = module_names(src)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from . import x, from ..y import z
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def train_edges(graph: dict[str, set[str]]) -> set[tuple[str, str, str, str]]:
    """(importing sub-package, imported sub-package, module, imported module) across wellfed.train's
    sub-packages."""
    def package(name: str) -> str | None:
        parts = name.split(".")
        return parts[2] if len(parts) >= 3 and parts[:2] == ["wellfed", "train"] else None

    return {(package(a), package(b), a, b) for a, targets in graph.items() for b in targets
            if package(a) and package(b) and package(a) != package(b)}


def test_src_has_no_import_cycle():
    graph = import_graph(PROJECT / "src")
    assert len(graph) > 100  # the walk saw the package
    assert sum(map(len, graph.values())) > 300  # and its imports
    found = cycles(graph)
    assert not found, "; ".join(
        f"import circle {' <-> '.join(c)}: move what they share to where it belongs (a module "
        "both can import), not an import into a function" for c in found)


def test_train_sub_packages_import_one_way():
    graph = import_graph(PROJECT / "src")
    packages = {p.name for p in (PROJECT / "src/wellfed/train").iterdir()
                if (p / "__init__.py").is_file()}
    assert {"step", "checkpoints", "outputs", "run"} <= packages <= set(TRAIN_DIRECTION), packages
    edges = train_edges(graph)
    assert {(a, b) for a, b, _, _ in edges} >= {("run", "step"), ("step", "checkpoints")}
    allowed = {a: ", ".join(sorted(b)) or "no other train sub-package"
               for a, b in TRAIN_DIRECTION.items()}
    wrong = sorted(f"{m} imports {t}: train/{a} may import {allowed[a]}"
                   for a, b, m, t in edges if b not in TRAIN_DIRECTION[a])
    assert not wrong, "; ".join(wrong) + " (docs/layout.md: imports flow one way)"


def plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "src"


def test_a_planted_circle_is_found_through_a_function_level_and_a_relative_import(tmp_path):
    src = plant(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import thing\n",
        "pkg/b.py": "def thing():\n    from . import c\n",  # inside a function, relative
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "from pkg import a, b\n",  # imports the circle, is not in it
        "pkg/sub/__init__.py": "from pkg.sub.e import E\n",
        "pkg/sub/e.py": "from pkg.sub import f\nE = 1\n",  # its own package: not a circle
        "pkg/sub/f.py": "",
    })
    graph = import_graph(src)
    assert graph["pkg.d"] == {"pkg.a", "pkg.b"} and graph["pkg.sub.e"] == {"pkg.sub.f"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_a_planted_import_against_the_train_direction_is_found(tmp_path):
    files = {f"wellfed/train/{p}/__init__.py": "" for p in ("step", "checkpoints", "run")}
    src = plant(tmp_path, {"wellfed/__init__.py": "", "wellfed/train/__init__.py": "", **files,
                           "wellfed/train/run/driver.py": "from wellfed.train.step import loop\n",
                           "wellfed/train/step/loop.py": "",
                           "wellfed/train/checkpoints/store.py":
                               "def load():\n    from wellfed.train.run import driver\n"})
    edges = train_edges(import_graph(src))
    assert {(a, b) for a, b, _, _ in edges} == {("run", "step"), ("checkpoints", "run")}
    assert sorted(e for e in edges if e[1] not in TRAIN_DIRECTION[e[0]]) == [
        ("checkpoints", "run", "wellfed.train.checkpoints.store", "wellfed.train.run"),
        ("checkpoints", "run", "wellfed.train.checkpoints.store", "wellfed.train.run.driver")]
