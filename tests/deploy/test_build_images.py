"""tests/cluster/build-images.sh's content key, which decides a rebuild, computed without building
(`--print`). The built archives are checked in tests/node/test_image_archives.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.images import OPERATOR_REF, TRAINER_REF, expected_archives
from support.tools import ROOT

pytestmark = pytest.mark.unit

# What the script reads, copied into a scratch repository the key tests may change.
CONTEXT = ["Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "api", "operator", "local", "trainer"]
CONTEXT += ["cli", "examples", "charts", "tests/cluster/build-images.sh", "tests/conftest.py"]


@pytest.fixture
def scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the build context plus the script, and an env whose cache is inside tmp_path."""
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in CONTEXT:
        source, target = ROOT / name, repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignore)
        else:
            shutil.copy2(source, target)
    return repo, {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}


def keys(repo: Path, env: dict[str, str]) -> dict[str, str]:
    return {ref: path.name for ref, path in expected_archives(repo, env).items()}


# (file to change, the images whose key must change). One sources hash serves both images: a
# file only the trainer stage copies (examples/) rebuilds the operator too, the cheap one.
CHANGES = [
    ("api/models.py", {OPERATOR_REF, TRAINER_REF}),
    ("trainer/__init__.py", {OPERATOR_REF, TRAINER_REF}),
    ("pyproject.toml", {OPERATOR_REF, TRAINER_REF}),
    ("Dockerfile", {OPERATOR_REF, TRAINER_REF}),
    ("examples/digits-cpu.yaml", {OPERATOR_REF, TRAINER_REF}),
    ("api/new_module.py", {OPERATOR_REF, TRAINER_REF}),
    ("tests/conftest.py", set()),
    ("api/__pycache__/models.cpython-311.pyc", set()),
    ("charts/kubetrain/values.yaml", set()),
]


@pytest.mark.parametrize(("changed", "rebuilt"), CHANGES)
def test_key_follows_what_the_build_copies(
    scratch: tuple[Path, dict[str, str]], changed: str, rebuilt: set[str]
) -> None:
    repo, env = scratch
    before = keys(repo, env)
    path = repo / changed
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write("\n# changed\n")
    after = keys(repo, env)
    assert {ref for ref in before if before[ref] != after[ref]} == rebuilt


def test_key_is_stable_and_names_the_image(scratch: tuple[Path, dict[str, str]]) -> None:
    repo, env = scratch
    found = expected_archives(repo, env)
    assert found == expected_archives(repo, env)
    assert found[OPERATOR_REF].name.startswith("operator-")
    assert found[TRAINER_REF].name.startswith("trainer-cpu-")
    assert all(path.parent == Path(env["XDG_CACHE_HOME"]) / "kubetrain" / "images" for path in found.values())
