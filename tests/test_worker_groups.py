"""The waiting tiers' worker groups (tests/support/worker_groups.py): every module that can start
the real node is in the one group that runs them one after another, so no two xdist workers
wait on the node's host lock; every other module stays whole on one worker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.tools import ROOT
from support.worker_groups import REAL_NODE_DIRS, REAL_NODE_GROUP, group_of

pytestmark = pytest.mark.unit

# The support modules that start a real node (support/node.py's running_node and what calls it).
NODE_MODULES = {"node", "realnode", "realjobs", "nodepods", "providers"}


def test_node_modules_share_one_group_and_others_keep_their_module() -> None:
    assert group_of("tests/node/test_real_node.py::test_x") == REAL_NODE_GROUP
    assert group_of("tests/e2e/test_cluster_e2e.py::test_y[a::b]") == REAL_NODE_GROUP
    one, other = (group_of(f"tests/operator/test_gang_cluster.py::test_{n}") for n in "ab")
    assert one == other == "tests/operator/test_gang_cluster.py"


def imported_support_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "support":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("support."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("support.")}
    return found


def test_every_module_that_can_start_the_real_node_is_in_its_group() -> None:
    outside = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("tests/support/") or relative.startswith(REAL_NODE_DIRS):
            continue
        if uses := imported_support_modules(path) & NODE_MODULES:
            outside.append(f"{relative} imports support.{', support.'.join(sorted(uses))}")
    assert outside == [], "move them under " + " or ".join(REAL_NODE_DIRS) + ", or widen REAL_NODE_DIRS"


def test_the_check_sees_an_import_of_the_node() -> None:
    found = imported_support_modules(ROOT / "tests" / "node" / "conftest.py")
    assert {"node", "nodepods"} <= found
