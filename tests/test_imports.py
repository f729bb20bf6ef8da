"""Each image ships only its half: the trainer imports without kopf/kubernetes, the operator without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

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
        ("kubetrain.trainer", "kopf,kubernetes,kubetrain.operator"),
        ("kubetrain.operator", "torch"),
    ],
)
def test_package_imports_without_the_other_half(package: str, blocked: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, package, blocked], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) >= 2, "expected to import several modules"


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
