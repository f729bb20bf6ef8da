"""Each image ships only its part: the API needs neither torch nor kopf, the trainer imports without
kopf/kubernetes or the CLI's libraries, the operator without torch, the client without kopf or torch;
the packages import each other without cycles (api <- trainer, api <- operator <- local,
api/local <- client <- cli); the client never imports the CLI, not even lazily."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

# Every module of the package is imported with the other half's libraries made unimportable,
# as they are in the slim images.
PROBE = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = set(sys.argv[2].split(","))

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, Block())
    package = importlib.import_module(sys.argv[1])
    names = [info.name for info in pkgutil.iter_modules(package.__path__, sys.argv[1] + ".")]
    for name in names:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED))
    assert not leaked, leaked
    print(len(names))
    """
)


@pytest.mark.parametrize(
    ("package", "blocked"),
    [
        ("kubetrain.api", "torch,kopf,kubernetes,typer,rich,matplotlib,kubetrain.operator,kubetrain.trainer"),
        ("kubetrain.trainer", "kopf,kubernetes,typer,rich,matplotlib,kubetrain.operator,kubetrain.local"),
        ("kubetrain.operator", "torch,matplotlib,kubetrain.local,kubetrain.trainer"),
        ("kubetrain.local", "kopf,kubernetes,torch,kubetrain.trainer"),
        # Every module, the local backend's included (the local runner imports the operator's
        # pure render and gang decision, never kopf).
        ("kubetrain.client", "kopf,torch,kubetrain.trainer"),
    ],
)
def test_package_imports_without_the_other_half(package: str, blocked: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, package, blocked], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) >= 2, "expected to import several modules"


def test_the_client_alone_imports_no_backend() -> None:
    """`from kubetrain.client import Client` in a notebook: each backend is imported by the Client
    that uses it, so the package itself pulls in neither the Kubernetes client nor the local runner."""
    heavy = ("kopf", "torch", "kubernetes", "rich", "matplotlib", "kubetrain.local", "kubetrain.operator")
    code = f"import sys, kubetrain.client; print(sorted(m for m in sys.modules if m.startswith({heavy!r})))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_bare_name_operator_is_still_the_stdlib() -> None:
    # The repo root is on sys.path under `python -m pytest`; operator/ has no __init__.py so
    # it can never shadow the stdlib module.
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            "import sys; sys.path.insert(0, '.'); import operator; print(operator.index(3))",
        ],
        capture_output=True,
        text=True,
        cwd=__file__.rsplit("/tests/", 1)[0],
    )
    assert result.stdout.strip() == "3", result.stderr


ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "api": "kubetrain.api",
    "operator": "kubetrain.operator",
    "local": "kubetrain.local",
    "runtime": "kubetrain.runtime",
    "trainer": "kubetrain.trainer",
    "cli": "kubetrain.cli",
    "client": "kubetrain.client",
}


def _sources() -> dict[str, Path]:
    """Every module of the product, those of subpackages (runtime/agent/...) included."""
    sources = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            if "site" not in parts:  # runtime/site/: a sitecustomize, loaded as a file
                sources[".".join((package, *parts))] = path
    return sources


def _module_imports() -> dict[str, set[str]]:
    """kubetrain module -> the kubetrain modules it imports, at module level and inside functions
    alike: a lazy import hides a circle from the interpreter, not from a reader."""
    sources = _sources()
    graph: dict[str, set[str]] = {}
    for name, path in sources.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kubetrain"):
                # `from kubetrain.api import naming` imports the module kubetrain.api.naming.
                targets |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in sources else node.module
                    for a in node.names
                }
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("kubetrain")}
        graph[name] = targets
    return graph


def test_no_import_cycles_between_modules_or_packages() -> None:
    graph = _module_imports()
    assert len(graph) > 20, graph

    def cycle_from(edges: dict[str, set[str]]) -> list[str] | None:
        state: dict[str, int] = {}
        stack: list[str] = []

        def visit(node: str) -> list[str] | None:
            state[node] = 1
            stack.append(node)
            for nxt in sorted(edges.get(node, ())):
                if state.get(nxt) == 1:
                    return [*stack[stack.index(nxt) :], nxt]
                if nxt not in state and (found := visit(nxt)):
                    return found
            stack.pop()
            state[node] = 2
            return None

        for node in sorted(edges):
            if node not in state and (found := visit(node)):
                return found
        return None

    assert cycle_from(graph) is None, f"import cycle: {' -> '.join(cycle_from(graph) or [])}"
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        own = ".".join(module.split(".")[:2])
        packages.setdefault(own, set()).update(".".join(t.split(".")[:2]) for t in targets)
        packages[own].discard(own)
    assert cycle_from(packages) is None, f"package cycle: {' -> '.join(cycle_from(packages) or [])}"
    # The floors the README's code map states: api -> runtime -> trainer -> local -> client -> cli,
    # the operator beside the runtime (on api), read by local for its gang decision.
    assert packages["kubetrain.api"] == set(), packages["kubetrain.api"]
    assert packages["kubetrain.runtime"] <= {"kubetrain.api"}
    assert packages["kubetrain.trainer"] <= {"kubetrain.api", "kubetrain.runtime"}
    assert packages["kubetrain.operator"] <= {"kubetrain.api"}
    assert packages["kubetrain.local"] <= {"kubetrain.api", "kubetrain.operator", "kubetrain.runtime"}
    assert packages["kubetrain.client"] <= {"kubetrain.api", "kubetrain.local", "kubetrain.runtime"}
    assert not [name for name, targets in packages.items() if "kubetrain.cli" in targets], packages


def test_the_runtime_needs_only_the_standard_library_torch_and_the_apis_plain_modules() -> None:
    """What runs beside user code runs in images without kubetrain's dependencies: no pydantic, no
    trainer (tests/trainer/test_runtime_bundle.py checks the whole closure it copies)."""
    sources = _sources()
    runtime = {name: path for name, path in sources.items() if name.startswith("kubetrain.runtime")}
    assert len(runtime) > 15, runtime
    found = [
        (name, imported)
        for name, path in runtime.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for imported in ([node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
        if imported.split(".")[0] == "pydantic" or imported.startswith(("kubetrain.trainer", "kubetrain.operator"))
    ]
    assert found == []


def test_the_client_never_imports_the_cli() -> None:
    """The CLI sits above the client (`kubetrain logs` reads with the client's log reader); a
    client module reaching for the CLI, even inside a function, would put it back below."""
    imports = [
        (f"client/{path.name}:{node.lineno}", name)
        for path in (ROOT / "client").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in ([node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
        if name.startswith("kubetrain.")
    ]
    assert len(imports) > 10, imports
    assert [(where, name) for where, name in imports if name.split(".")[:2] == ["kubetrain", "cli"]] == []


def test_test_module_basenames_are_unique() -> None:
    # Test folders are not packages: pytest imports each test file by its basename, so two
    # test_x.py in different folders make the whole collection fail ("import file mismatch").
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


# The operator's decisions (STYLE.md: pure rendering and deciding, side effects in one place):
# neither they nor anything they import talks to the cluster or waits on an event loop.
PURE = [
    "archive",
    "conditions",
    "decision",
    "failures",
    "kueue",
    "podgroup",
    "pods",
    "progress",
    "refusal",
    "render",
    "status",
]
IO = {"aiohttp", "asyncio", "kopf", "kubernetes"} | {
    f"kubetrain.operator.{name}"
    for name in (
        "archive_io",
        "controller",
        "handlers",
        "informer",
        "kube",
        "kueue_io",
        "logs_io",
        "podgroup_io",
        "run",
        "workqueue",
    )
}


@pytest.mark.parametrize("module", PURE)
def test_the_operators_decisions_reach_no_io(module: str) -> None:
    graph, sources = _module_imports(), _sources()
    reached, todo = set(), [f"kubetrain.operator.{module}"]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += graph.get(name, ())
    libraries = {
        (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]: name
        for name in reached & sources.keys()
        for node in ast.parse(sources[name].read_text()).body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert reached & IO == set()
    assert {library: by for library, by in libraries.items() if library in IO} == {}
