"""No module of ours imports itself back, through any chain: a circle makes the import order decide what is
defined when, and hides which of two modules is the lower one. Every import counts, at module level or in a
function, under TYPE_CHECKING or not (one placed there to dodge a circle still is one): a piece two modules
share belongs in a third, or is passed in."""
from __future__ import annotations

import ast
from pathlib import Path

from plumbing.settings import REPO_ROOT

PACKAGES = ("schemas", "engine", "plumbing", "migrations", "infra", "projections", "consumers", "producers",
            "bench", "ledgerlm")

Graph = dict[str, set[str]]


def modules_of(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted name -> file of every module under `packages` (a package by its `__init__.py`)."""
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def nearest_module(name: str, modules: dict[str, Path]) -> str | None:
    """`name` itself, or the closest package or module above it that is ours (`a.b.Thing` -> `a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The dotted names an import statement may load, relative ones resolved against `package`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> Graph:
    """Module -> the modules of ours it imports, wherever in the file the import stands."""
    modules = modules_of(root, packages)
    graph: Graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = {nearest_module(imported, modules)
                   for node in ast.walk(ast.parse(path.read_text(), str(path)))
                   if isinstance(node, (ast.Import, ast.ImportFrom))
                   for imported in imported_names(node, package)}
        graph[name] = targets - {None, name}
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One import circle as its modules in order, the first repeated at the end; None when there is none."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for target in sorted(graph.get(module, ())):
            if target in on_path:
                return path[path.index(target):] + [target]
            if target not in done and (cycle := visit(target)) is not None:
                return cycle
        on_path.discard(path.pop())
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_no_module_imports_itself_back():
    cycle = find_cycle(import_graph(REPO_ROOT))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_circle_through_a_relative_import_in_a_function_is_found(tmp_path):
    """The check above can fail: a circle closed only inside a function, by a relative import, is one."""
    write(tmp_path, {"pkg/__init__.py": "", "pkg/low.py": "def late():\n    from .high import thing\n",
                     "pkg/high.py": "from pkg.low import late\nthing = 1\n", "pkg/alone.py": "import os\n"})
    assert find_cycle(import_graph(tmp_path, ("pkg",))) == ["pkg.high", "pkg.low", "pkg.high"]


def test_a_circle_under_type_checking_is_found_and_a_chain_is_not_a_circle(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/sub/__init__.py": "",
                     "pkg/sub/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..b import B\n",
                     "pkg/b.py": "from pkg.sub import a\nclass B: ...\n", "pkg/c.py": "from pkg import b\n"})
    assert find_cycle(import_graph(tmp_path, ("pkg",))) == ["pkg.b", "pkg.sub.a", "pkg.b"]
    (tmp_path / "pkg/sub/a.py").write_text("")
    assert find_cycle(import_graph(tmp_path, ("pkg",))) is None
