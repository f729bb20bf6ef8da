"""tests/cluster/build-images.sh: lint, the content key that decides a rebuild, and the built
archives' OCI config against what the Dockerfile says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import IO, Any

import pytest
from support.controlplane import Unavailable
from support.images import BUILD_SCRIPT, OPERATOR_REF, TRAINER_REF, archives, expected_archives
from support.tools import ROOT, missing_tool

from kubetrain.api.contract import DEFAULT_COMMAND
from kubetrain.operator.render import RUN_AS_USER

# What the script reads, copied into a scratch repository the key tests may change.
CONTEXT = ["Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "api", "operator", "local", "trainer"]
CONTEXT += ["cli", "examples", "charts", "tests/cluster/build-images.sh", "tests/conftest.py"]


def test_ci_builds_the_images_before_pytest() -> None:
    """CI's command (tests/run.sh) runs the script after the control plane's binaries, as a step."""
    run_sh = (ROOT / "tests" / "run.sh").read_text()
    order = [
        run_sh.find(marker) for marker in ("tests/cluster/install.sh", "tests/cluster/build-images.sh", 'pytest "$@"')
    ]
    assert -1 not in order and order == sorted(order), order


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


def test_skip_knob_builds_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "KUBETRAIN_SKIP_IMAGES": "1", "XDG_CACHE_HOME": str(tmp_path)}
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert "KUBETRAIN_SKIP_IMAGES=1" in result.stderr
    assert list(tmp_path.iterdir()) == []


# --- the built archives ---------------------------------------------------------------------------


def built(ref: str) -> Path:
    try:
        return archives(ref)[ref]
    except Unavailable as exc:
        missing_tool(str(exc))
        raise


def blob(tar: tarfile.TarFile, digest: str) -> IO[bytes]:
    member = tar.extractfile(f"blobs/{digest.replace(':', '/')}")
    assert member is not None, f"{tar.name} lacks blob {digest}"
    return member


def oci_image(tar: tarfile.TarFile) -> tuple[dict[str, Any], dict[str, Any]]:
    """(index.json, image config plus the manifest's layers) of a single-image OCI archive."""
    index_file = tar.extractfile("index.json")
    assert index_file is not None
    index = json.load(index_file)
    [entry] = index["manifests"]
    manifest = json.load(blob(tar, entry["digest"]))
    return index, {**json.load(blob(tar, manifest["config"]["digest"])), "layers": manifest["layers"]}


USER = f"{RUN_AS_USER}:{RUN_AS_USER}"
EXPECTED_CONFIG = {
    OPERATOR_REF: {
        "User": USER,
        "Entrypoint": ["kubetrain"],
        "Cmd": ["operator"],
        "ExposedPorts": {"8000/tcp": {}, "8080/tcp": {}},
        "title": "kubetrain-operator",
    },
    TRAINER_REF: {
        "User": USER,
        "Cmd": list(DEFAULT_COMMAND),
        "WorkingDir": "/opt/kubetrain",
        "title": "kubetrain-trainer",
    },
}


@pytest.mark.parametrize("ref", [OPERATOR_REF, TRAINER_REF])
def test_archive_config_is_what_the_dockerfile_says(ref: str) -> None:
    with tarfile.open(built(ref)) as tar:
        index, image = oci_image(tar)
    # containerd names the imported image after this annotation: the full ref the kubelet asks for.
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == ref
    config = image["config"]
    expected = dict(EXPECTED_CONFIG[ref])
    assert config["Labels"]["org.opencontainers.image.title"] == expected.pop("title")
    assert config["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert {key: config.get(key) for key in expected} == expected
    assert "PYTHONUNBUFFERED=1" in config["Env"]
    assert image["os"] == "linux" and image["architecture"] == "amd64"


# A file each image's own layers must hold, proving the layers read are the image's.
INSTALLED = {
    OPERATOR_REF: "opt/venv/bin/kopf",
    TRAINER_REF: "usr/local/lib/python3.11/site-packages/torch/__init__.py",
}


@pytest.mark.parametrize("ref", [OPERATOR_REF, TRAINER_REF])
def test_build_mounts_leave_no_trace(ref: str) -> None:
    """The wheel index is bind-mounted at the base's empty /mnt only for RUN steps: the layers
    above the base hold what an online build installs, and no mount point or build-only file."""
    names: set[str] = set()
    with tarfile.open(built(ref)) as tar:
        _, image = oci_image(tar)
        for layer in image["layers"][1:]:
            with tarfile.open(fileobj=blob(tar, layer["digest"]), mode="r:*") as layer_tar:
                names.update(entry.name.removeprefix("./") for entry in layer_tar)
    assert INSTALLED[ref] in names
    leftovers = {name for name in names if name.split("/")[0] in ("mnt", "wheels-cache") or name == "etc/pip.conf"}
    assert leftovers == set()
    if ref == OPERATOR_REF:
        assert not any("/torch/" in name for name in names)
