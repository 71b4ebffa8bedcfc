"""Dependencies point one way (docs/style.md, rule 2): schemas and the engine at the bottom, knowing nothing of
each other, the shared plumbing above the schemas (never the engine: a gateway or a projector must not need it),
the roles above that (the projections' read models below the producers that query them), and the CLI
package (`ledgerlm`) on top as the only composition root. ALLOWED lists exactly the arrows in use."""
from __future__ import annotations

import ast
from pathlib import Path

from plumbing.settings import REPO_ROOT

# package -> top-level packages it may import (besides itself, the standard library and third parties)
ALLOWED = {
    "schemas": set(),
    "engine": set(),
    "plumbing": {"schemas"},
    "migrations": set(),
    "infra": {"schemas", "plumbing"},
    "projections": {"schemas", "plumbing", "migrations"},
    "consumers": {"schemas", "plumbing", "engine"},
    "producers": {"schemas", "plumbing", "engine", "projections"},
    "bench": {"schemas", "plumbing", "engine", "migrations", "projections", "consumers", "producers", "infra"},
}
OURS = set(ALLOWED) | {"ledgerlm", "tests"}


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & OURS


def test_every_package_imports_only_what_is_below_it():
    wrong = []
    for package, allowed in ALLOWED.items():
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for name in imported_packages(path) - allowed - {package}:
                wrong.append(f"{path.relative_to(REPO_ROOT)} imports {name}")
    assert wrong == []


def test_every_allowed_arrow_is_in_use():
    """An arrow nothing uses any more leaves the table, so the table stays the picture of the layers."""
    unused = []
    for package, allowed in ALLOWED.items():
        used = set().union(*(imported_packages(path) for path in (REPO_ROOT / package).rglob("*.py")))
        unused += [f"{package} -> {name}" for name in sorted(allowed - used)]
    assert unused == []


def test_only_the_cli_package_imports_the_cli():
    wrong = [str(path.relative_to(REPO_ROOT)) for package in ALLOWED
             for path in sorted((REPO_ROOT / package).rglob("*.py")) if "ledgerlm" in imported_packages(path)]
    assert wrong == []
