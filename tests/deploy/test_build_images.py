"""tests/cluster/build-images.sh's content key, which decides a rebuild, computed without building
(`--print`), and the guest image's recipe (tests/cluster/guest.Dockerfile). The built archives are
checked in tests/node/test_image_archives.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from support.images import GUEST_REF, OPERATOR_REF, TRAINER_REF, expected_archives
from support.tools import ROOT

from kubetrain.operator.render import RUN_AS_USER

pytestmark = pytest.mark.unit

# What the script reads, copied into a scratch repository the key tests may change.
CONTEXT = ["Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "api", "operator", "local", "trainer"]
CONTEXT += ["cli", "client", "examples", "charts", "tests/cluster/build-images.sh", "tests/cluster/guest.Dockerfile"]
CONTEXT += ["tests/conftest.py"]
GUEST_DOCKERFILE = ROOT / "tests" / "cluster" / "guest.Dockerfile"


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
# file only the trainer stage copies (examples/) rebuilds the operator too, the cheap one. The
# guest is built on the trainer and archived with it: it follows the trainer's key, and its own
# recipe rebuilds the two of them, not the operator.
ALL = {OPERATOR_REF, TRAINER_REF, GUEST_REF}
CHANGES = [
    ("api/models.py", ALL),
    ("trainer/__init__.py", ALL),
    ("pyproject.toml", ALL),
    ("Dockerfile", ALL),
    ("examples/digits-cpu.yaml", ALL),
    ("api/new_module.py", ALL),
    ("tests/cluster/guest.Dockerfile", {TRAINER_REF, GUEST_REF}),
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
    assert found[GUEST_REF] == found[TRAINER_REF], "the guest is archived with the trainer, whose blobs it shares"
    assert all(path.parent == Path(env["XDG_CACHE_HOME"]) / "kubetrain" / "images" for path in found.values())


def dev_pins() -> dict[str, str]:
    """The [dev] extra's exact pins, {name: version}."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    return dict(pin.split("==") for pin in dev if "==" in pin)


def test_guest_pins_come_from_pyproject(scratch: tuple[Path, dict[str, str]]) -> None:
    """The script reads the frameworks' pins from the [dev] extra (one place): without an exact
    pin it stops, naming those it found."""
    repo, env = scratch
    pyproject = repo / "pyproject.toml"
    version = dev_pins()["lightning"]
    text = pyproject.read_text()
    assert text.count(f'"lightning=={version}"') == 1
    pyproject.write_text(text.replace(f'"lightning=={version}"', '"lightning"'))
    result = subprocess.run(
        ["bash", str(repo / "tests" / "cluster" / "build-images.sh"), "--print"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode != 0
    assert "must pin transformers, accelerate and lightning" in result.stderr
    pins = dev_pins()
    assert f"found: transformers=={pins['transformers']} accelerate=={pins['accelerate']}\n" in result.stderr


def test_guest_is_one_run_on_the_trainer_as_its_user() -> None:
    """One RUN (one layer with --layers=false), no COPY/ADD, FROM the trainer's ref, and the
    trainer's user last; and the frameworks the dev extra pins are the ones it checks."""
    lines = re.sub(r"\\\n", " ", GUEST_DOCKERFILE.read_text()).splitlines()
    instructions = [line.split(None, 1) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    keywords = [keyword.upper() for keyword, *_ in instructions]
    assert keywords.count("RUN") == 1
    assert not {"COPY", "ADD", "WORKDIR"} & set(keywords)
    args = dict(rest.split("=", 1) for keyword, rest in instructions if keyword == "ARG" and "=" in rest)
    assert args["TRAINER_IMAGE"] == TRAINER_REF
    # The trainer's user, which the operator renders as runAsUser.
    assert [rest for keyword, rest in instructions if keyword == "USER"][-1] == f"{RUN_AS_USER}:{RUN_AS_USER}"
    [run] = [rest for keyword, rest in instructions if keyword == "RUN"]
    assert "pip uninstall -y kubetrain pydantic pydantic-core" in run
    assert "kubetrain-torchrun-hooks.pth" in run
    assert {"transformers", "accelerate", "lightning"} <= set(dev_pins())
    assert "import sys, torch, transformers, accelerate, lightning" in run
