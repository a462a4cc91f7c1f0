"""The packages' boundary (docs/architecture.md): contract/ is what both sides share and
imports neither; workers/ (the GPU hosts) never imports bot/; bot/ imports workers/ only in
its command line, whose host commands start the worker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
ALLOWED = {("bot", "workers"): {"bot/cli.py"}}


def imported(path: Path) -> set[str]:
    """Every top-level package a module imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def crossings(package: str, other: str) -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / package).rglob("*.py")
        if other in imported(path)
    )


@pytest.mark.parametrize(
    ("package", "other"),
    [("contract", "bot"), ("contract", "workers"), ("workers", "bot"), ("bot", "workers")],
)
def test_packages_import_only_across_the_drawn_boundary(package: str, other: str) -> None:
    allowed = ALLOWED.get((package, other), set())

    assert set(crossings(package, other)) <= allowed


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from bot.runs import Run\n    import workers.host\n")

    assert imported(module) == {"bot", "workers"}
