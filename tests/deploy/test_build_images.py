"""tests/cluster/build-images.sh's content keys, which decide a rebuild, computed without building
(`--print`), the layout's tidying (tests/support/ocilayout.py), and the guest image's recipe
(tests/cluster/guest.Dockerfile). The built images are checked in tests/node/test_built_images.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from support import ocilayout
from support.images import GUEST_REF, OPERATOR_REF, TRAINER_REF, copy_build_inputs, expected_images
from support.tools import ROOT

from kubetrain.operator.render import RUN_AS_USER

pytestmark = pytest.mark.unit

GUEST_DOCKERFILE = ROOT / "tests" / "cluster" / "guest.Dockerfile"


@pytest.fixture
def scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of what the script reads (and files it must not read, which the key tests change),
    and an env whose cache is inside tmp_path."""
    repo = copy_build_inputs(tmp_path / "repo", "charts", "tests/conftest.py")
    return repo, {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}


def keys(repo: Path, env: dict[str, str]) -> dict[str, str]:
    return {ref: image.tag for ref, image in expected_images(repo, env).items()}


# (file to change, the images whose key must change). One sources hash serves both images: a
# file only the trainer stage copies (examples/) rebuilds the operator too, the cheap one. The
# guest is built on the trainer's dependency stage: kubetrain's code does not touch it; the
# Dockerfile and pyproject (which that stage reads) and its own recipe do.
ALL = {OPERATOR_REF, TRAINER_REF, GUEST_REF}
CODE = {OPERATOR_REF, TRAINER_REF}
CHANGES = [
    ("api/models.py", CODE),
    ("trainer/__init__.py", CODE),
    ("pyproject.toml", ALL),
    ("Dockerfile", ALL),
    ("examples/digits-cpu.yaml", CODE),
    ("api/new_module.py", CODE),
    ("tests/cluster/guest.Dockerfile", {GUEST_REF}),
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
    found = expected_images(repo, env)
    assert found == expected_images(repo, env)
    assert found[OPERATOR_REF].tag.startswith("operator-")
    assert found[TRAINER_REF].tag.startswith("trainer-cpu-")
    assert found[GUEST_REF].tag.startswith("guest-cpu-")
    # One layout holds them all: the blobs they share are stored once.
    assert {image.layout for image in found.values()} == {
        Path(env["XDG_CACHE_HOME"]) / "kubetrain" / "images" / "layout"
    }


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
    """One RUN (one layer), no COPY/ADD, FROM the trainer's dependency stage (no kubetrain in it),
    and the trainer's user last; and the frameworks the dev extra pins are the ones it checks."""
    lines = re.sub(r"\\\n", " ", GUEST_DOCKERFILE.read_text()).splitlines()
    instructions = [line.split(None, 1) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    keywords = [keyword.upper() for keyword, *_ in instructions]
    assert keywords.count("RUN") == 1
    assert not {"COPY", "ADD", "WORKDIR"} & set(keywords)
    args = dict(rest.split("=", 1) for keyword, rest in instructions if keyword == "ARG" and "=" in rest)
    assert args["DEPS_IMAGE"] == "docker.io/kubetrain/trainer-deps:0.1.0-cpu"
    assert "DEPS_REF=" + args["DEPS_IMAGE"] in (ROOT / "tests" / "cluster" / "build-images.sh").read_text()
    # The trainer's user, which the operator renders as runAsUser.
    assert [rest for keyword, rest in instructions if keyword == "USER"][-1] == f"{RUN_AS_USER}:{RUN_AS_USER}"
    [run] = [rest for keyword, rest in instructions if keyword == "RUN"]
    assert "pip uninstall -y pydantic pydantic-core" in run
    assert {"transformers", "accelerate", "lightning"} <= set(dev_pins())
    assert "import sys, torch, transformers, accelerate, lightning" in run


def test_the_layout_keeps_the_tags_it_is_given_and_their_blobs_only(tmp_path: Path) -> None:
    """gc after a build: the old trainer's tag goes, and with it the blobs only it used; a layer it
    shared with the kept images (torch's) stays."""
    layout = tmp_path / "layout"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    def image(tag: str, *layers: bytes) -> dict[str, object]:
        config = blob(json.dumps({"tag": tag}).encode())
        manifest = blob(json.dumps({"config": config, "layers": [blob(layer) for layer in layers]}).encode())
        return {**manifest, "annotations": {ocilayout.REF_NAME: tag}}

    entries = [image("trainer-cpu-old", b"torch", b"old code"), image("trainer-cpu-new", b"torch", b"new code")]
    entries.append(image("guest-cpu-1", b"torch", b"frameworks"))
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": entries}))
    before = {path.name for path in blobs.iterdir()}
    removed, freed = ocilayout.gc(layout, ["trainer-cpu-new", "guest-cpu-1", "operator-absent"])
    assert removed == ["trainer-cpu-old"]
    assert set(ocilayout.tags(layout)) == {"trainer-cpu-new", "guest-cpu-1"}
    gone = before - {path.name for path in blobs.iterdir()}
    old_config = json.dumps({"tag": "trainer-cpu-old"}).encode()
    old_manifest = str(entries[0]["digest"]).removeprefix("sha256:")
    assert gone == {hashlib.sha256(data).hexdigest() for data in (b"old code", old_config)} | {old_manifest}
    assert freed == sum(len(data) for data in (b"old code", old_config)) + int(str(entries[0]["size"]))
    assert not ocilayout.LayoutImage(layout, "trainer-cpu-old").exists()
    # The script asks the same way whether a tag is built (whoever wrote index.json last).
    assert ocilayout.main(["has", str(layout), "trainer-cpu-new"]) == 0
    assert ocilayout.main(["has", str(layout), "trainer-cpu-old"]) == 1
    for tag in ("trainer-cpu-new", "guest-cpu-1"):
        kept = ocilayout.LayoutImage(layout, tag)
        assert all(kept.blob(b["digest"]).is_file() for b in kept.blobs())
