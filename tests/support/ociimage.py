"""FROM-scratch OCI image archives written directly: one layer holding static binaries, no
builder. The real node's pause sandbox image and the node tests' workload image are made this
way, so that a node comes up without buildah or a registry. `ctr images import` reads them.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# ctr names an imported image after this annotation (the OCI ref.name alone is only a tag).
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"


def _blob(archive: tarfile.TarFile, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest.removeprefix('sha256:')}")
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))
    return digest


def _layer(files: Mapping[str, Path]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for name, source in sorted(files.items()):
            info = tarfile.TarInfo(name.lstrip("/"))
            data = source.read_bytes()
            info.size, info.mode = len(data), 0o755
            layer.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def scratch_image(
    ref: str, files: Mapping[str, Path], entrypoint: Sequence[str], out: Path, *, ref_name_only: bool = False
) -> Path:
    """Write an OCI image-layout tar at `out` named `ref` (e.g. "registry.k8s.io/pause:3.10"):
    `files` maps paths in the image to host files (made executable), run as `entrypoint`.
    `ref_name_only`: name it only by a full-ref org.opencontainers.image.ref.name, as
    `buildah push ... oci-archive:` does."""
    layer = _layer(files)
    with tarfile.open(out, "w") as archive:
        layer_digest = _blob(archive, layer)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": list(entrypoint)},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
        config_digest = _blob(archive, _json(config))
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config_digest,
                    "size": len(_json(config)),
                },
                "layers": [
                    {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": len(layer)}
                ],
            }
        )
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _blob(archive, manifest),
                    "size": len(manifest),
                    "annotations": {OCI_REF_NAME: ref}
                    if ref_name_only
                    else {CONTAINERD_NAME: ref, OCI_REF_NAME: ref.rpartition(":")[2]},
                }
            ],
        }
        for name, data in (("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", _json(index))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out


def archive_images(archive: Path) -> dict[str, str]:
    """The images an OCI archive names, {name: manifest digest}: how a node tells whether it
    already imported it."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive}: no index.json (not an OCI image layout archive)")
        index = json.load(member)
    return {
        m["annotations"].get(CONTAINERD_NAME) or m["annotations"][OCI_REF_NAME]: m["digest"]
        for m in index["manifests"]
        if m.get("annotations", {}).get(CONTAINERD_NAME) or m.get("annotations", {}).get(OCI_REF_NAME)
    }
