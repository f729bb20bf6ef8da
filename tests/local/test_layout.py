"""kubetrain.local's modules import each other in one direction, counting imports inside
functions too (a lazy import hides a cycle from the import system, not from a reader)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

LOCAL = Path(__file__).resolve().parents[2] / "local"


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            found |= {name.removeprefix("kubetrain.local.") for name in names if name.startswith("kubetrain.local.")}
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix("kubetrain.local.") for a in node.names if a.name.startswith("kubetrain.local.")
            }
    return found


def test_no_cycle_through_function_level_imports() -> None:
    modules = {path.stem for path in LOCAL.glob("*.py")}
    graph = {path.stem: imports_of(path) & modules for path in LOCAL.glob("*.py")}
    assert {"plan", "supervisor", "view", "processes", "run"} <= modules

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in graph[start])

    cycles = sorted(module for module in graph if reaches(module, module, {module}))
    assert not cycles, {module: graph[module] for module in cycles}
