"""The images tests/cluster/build-images.sh built (the node tier builds them, as root): each
archive's OCI config is what the Dockerfile says, and the build left no trace of its mounts. The
trainer's archive holds the guest image too (tests/cluster/guest.Dockerfile: a user's own image,
with the frameworks and without kubetrain), sharing its layers."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import IO, Any

import pytest
from support.controlplane import Unavailable
from support.images import GUEST_REF, OPERATOR_REF, TRAINER_REF, archives
from support.tools import missing_tool

from kubetrain.api.contract import DEFAULT_COMMAND
from kubetrain.operator.render import RUN_AS_USER

pytestmark = pytest.mark.node


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


REF_NAME = "org.opencontainers.image.ref.name"


def oci_image(tar: tarfile.TarFile, ref: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(index.json's entry of `ref`, image config plus the manifest's layers) in an OCI archive."""
    index_file = tar.extractfile("index.json")
    assert index_file is not None
    # containerd names an imported image after this annotation: the full ref the kubelet asks for.
    [entry] = [e for e in json.load(index_file)["manifests"] if e.get("annotations", {}).get(REF_NAME) == ref]
    manifest = json.load(blob(tar, entry["digest"]))
    return entry, {**json.load(blob(tar, manifest["config"]["digest"])), "layers": manifest["layers"]}


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
    GUEST_REF: {
        "User": USER,
        "Cmd": ["python"],
        "WorkingDir": "/opt/kubetrain",
        "title": "kubetrain-test-guest",
    },
}
REFS = [OPERATOR_REF, TRAINER_REF, GUEST_REF]


@pytest.mark.parametrize("ref", REFS)
def test_archive_config_is_what_the_dockerfile_says(ref: str) -> None:
    with tarfile.open(built(ref)) as tar:
        _, image = oci_image(tar, ref)
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
    GUEST_REF: "usr/local/lib/python3.11/site-packages/transformers/__init__.py",
}
PURELIB = "usr/local/lib/python3.11/site-packages"


@pytest.mark.parametrize("ref", REFS)
def test_build_mounts_leave_no_trace(ref: str) -> None:
    """The wheel index is bind-mounted at the base's empty /mnt only for RUN steps: the layers
    above the base hold what an online build installs, and no mount point or build-only file."""
    names: set[str] = set()
    with tarfile.open(built(ref)) as tar:
        _, image = oci_image(tar, ref)
        for layer in image["layers"][1:]:
            with tarfile.open(fileobj=blob(tar, layer["digest"]), mode="r:*") as layer_tar:
                last = {entry.name.removeprefix("./") for entry in layer_tar}
                names.update(last)
    assert INSTALLED[ref] in names
    leftovers = {name for name in names if name.split("/")[0] in ("mnt", "wheels-cache") or name == "etc/pip.conf"}
    assert leftovers == set()
    if ref == OPERATOR_REF:
        assert not any("/torch/" in name for name in names)
    if ref == GUEST_REF:
        # Its own layer deletes kubetrain, its .pth and pydantic (whiteouts over the trainer's files).
        for gone in ("kubetrain", "kubetrain-torchrun-hooks.pth", "pydantic", "pydantic_core"):
            assert f"{PURELIB}/.wh.{gone}" in last, gone
