"""The images tests/cluster/build-images.sh built into its OCI layout (the node tier builds them,
as root): each image's OCI config is what the Dockerfile says, the build left no trace of its
mounts, and the layers match how they change: the trainer is its dependency stage's layers (torch)
plus a few small ones of kubetrain, and the guest (tests/cluster/guest.Dockerfile: a user's own
image, the frameworks and no kubetrain) is one layer on that same stage."""

from __future__ import annotations

import tarfile
from typing import Any

import pytest
from support.controlplane import Unavailable
from support.images import GUEST_REF, OPERATOR_REF, TRAINER_REF, built
from support.ocilayout import LayoutImage
from support.tools import missing_tool

from kubetrain.api.contract import DEFAULT_COMMAND
from kubetrain.operator.render import RUN_AS_USER

pytestmark = pytest.mark.node


def image_of(ref: str) -> LayoutImage:
    try:
        return built(ref)[ref]
    except Unavailable as exc:
        missing_tool(str(exc))
        raise


USER = f"{RUN_AS_USER}:{RUN_AS_USER}"
EXPECTED_CONFIG: dict[str, dict[str, Any]] = {
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
    GUEST_REF: {
        "User": USER,
        "Cmd": ["python"],
        "WorkingDir": "/opt/kubetrain",
        "title": "kubetrain-test-guest",
    },
}
REFS = [OPERATOR_REF, TRAINER_REF, GUEST_REF]


@pytest.mark.parametrize("ref", REFS)
def test_image_config_is_what_the_dockerfile_says(ref: str) -> None:
    image = image_of(ref).config()
    config = image["config"]
    expected = dict(EXPECTED_CONFIG[ref])
    assert config["Labels"]["org.opencontainers.image.title"] == expected.pop("title")
    assert config["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert {key: config.get(key) for key in expected} == expected
    assert "PYTHONUNBUFFERED=1" in config["Env"]
    assert image["os"] == "linux" and image["architecture"] == "amd64"


def layer_names(image: LayoutImage, layer: dict[str, Any]) -> set[str]:
    with tarfile.open(image.blob(layer["digest"]), mode="r:*") as layer_tar:
        return {entry.name.removeprefix("./") for entry in layer_tar}


# A file each image's own layers must hold, proving the layers read are the image's.
INSTALLED = {
    OPERATOR_REF: "opt/venv/bin/kopf",
    TRAINER_REF: "usr/local/lib/python3.11/site-packages/torch/__init__.py",
    GUEST_REF: "usr/local/lib/python3.11/site-packages/transformers/__init__.py",
}
PURELIB = "usr/local/lib/python3.11/site-packages"


@pytest.mark.parametrize("ref", REFS)
def test_build_mounts_leave_no_trace(ref: str) -> None:
    """The wheel index is bind-mounted at the base's empty /mnt only for RUN steps: the layers
    above the base hold what an online build installs, and no mount point or build-only file."""
    image = image_of(ref)
    per_layer = [layer_names(image, layer) for layer in image.manifest()["layers"][1:]]
    names = set().union(*per_layer)
    assert INSTALLED[ref] in names
    leftovers = {name for name in names if name.split("/")[0] in ("mnt", "wheels-cache") or name == "etc/pip.conf"}
    assert leftovers == set()
    if ref == OPERATOR_REF:
        assert not any("/torch/" in name for name in names)
    if ref == GUEST_REF:
        assert not any("kubetrain" in name.split("/")[-1] for name in names if name.startswith(PURELIB))
        # Its own layer deletes pydantic (whiteouts over the dependency stage's files).
        [own] = [layer for layer in per_layer if f"{PURELIB}/transformers/__init__.py" in layer]
        for gone in ("pydantic", "pydantic_core"):
            assert f"{PURELIB}/.wh.{gone}" in own, gone


def sizes(image: LayoutImage) -> list[tuple[str, int]]:
    return [(layer["digest"], layer["size"]) for layer in image.manifest()["layers"]]


def test_kubetrain_is_a_few_small_layers_on_what_the_guest_shares() -> None:
    """The trainer and the guest share every layer under their own (the base, torch and the
    trainer's dependencies): the node holds them once. What kubetrain's code adds on top is small,
    so that a change to it moves megabytes, not the GBs of torch."""
    trainer, guest = sizes(image_of(TRAINER_REF)), sizes(image_of(GUEST_REF))
    shared = 0
    while shared < min(len(trainer), len(guest)) and trainer[shared] == guest[shared]:
        shared += 1
    assert shared >= 2, "the guest is not built on the trainer's dependency stage"
    assert len(guest) == shared + 1, "the guest is more than one layer on the shared stage"
    below, own = sum(size for _, size in trainer[:shared]), sum(size for _, size in trainer[shared:])
    assert below > 2 * 2**30, f"torch's layers hold {below} bytes"
    assert own < 20 * 2**20, f"kubetrain's layers on the trainer hold {own} bytes: {trainer[shared:]}"
