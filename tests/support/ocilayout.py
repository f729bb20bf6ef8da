"""The images tests/cluster/build-images.sh builds live in one OCI image layout (a directory:
index.json, blobs/sha256/), their layers stored uncompressed and shared: skopeo writes only the
blobs the layout lacks, so a change to kubetrain's code adds its own small layers, and torch's
GBs are written once. Each image is tagged there `<name>-<content key>`.

A node takes an image from it by an import of just the blobs its containerd lacks
(`import_stream`): containerd unpacks a manifest whose other layers it already holds. The build
script calls `gc` (`python3 ocilayout.py gc LAYOUT TAG...`) to drop every other tag and the blobs
no kept image refers to, and `has` (`python3 ocilayout.py has LAYOUT TAG`, exit status 0 when the
tag is there). Standard library only: the script runs it with the host's python3.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REF_NAME = "org.opencontainers.image.ref.name"
# ctr names an imported image after this annotation.
CONTAINERD_NAME = "io.containerd.image.name"
OCI_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'


@dataclass(frozen=True)
class LayoutImage:
    """One image of a layout: `layout` the directory, `tag` its ref name in index.json."""

    layout: Path
    tag: str

    @classmethod
    def parse(cls, spec: str) -> LayoutImage:
        """`oci:<layout>:<tag>`, the form the build script prints (and skopeo reads)."""
        if not spec.startswith("oci:") or ":" not in spec[4:]:
            raise ValueError(f"{spec!r}: expected oci:<layout directory>:<tag>")
        layout, _, tag = spec[4:].rpartition(":")
        return cls(Path(layout), tag)

    def __str__(self) -> str:
        return f"oci:{self.layout}:{self.tag}"

    def exists(self) -> bool:
        return self.tag in tags(self.layout)

    def descriptor(self) -> dict[str, Any]:
        """index.json's entry of this image (its manifest's descriptor)."""
        found = tags(self.layout).get(self.tag)
        if found is None:
            raise LookupError(f"{self}: no such tag in {self.layout / 'index.json'}")
        return found

    def blob(self, digest: str) -> Path:
        return self.layout / "blobs" / digest.replace(":", "/", 1)

    def manifest(self) -> dict[str, Any]:
        return read_json(self.blob(self.descriptor()["digest"]))

    def config(self) -> dict[str, Any]:
        return read_json(self.blob(self.manifest()["config"]["digest"]))

    def blobs(self) -> list[dict[str, Any]]:
        """The descriptors of every blob the image needs: manifest, config, layers (in order)."""
        manifest = self.manifest()
        return [self.descriptor(), manifest["config"], *manifest["layers"]]


def read_json(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        value = json.load(handle)
    assert isinstance(value, dict), path
    return value


def tags(layout: Path) -> dict[str, dict[str, Any]]:
    """{ref name: manifest descriptor} of the layout's index.json ({} without one)."""
    try:
        index = read_json(layout / "index.json")
    except FileNotFoundError:
        return {}
    return {
        entry["annotations"][REF_NAME]: entry
        for entry in index["manifests"]
        if REF_NAME in entry.get("annotations", {})
    }


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def import_stream(out: IO[bytes], images: Mapping[str, LayoutImage], have: Iterable[str]) -> list[str]:
    """Write to `out` an OCI archive for `ctr images import` naming each image (key: the name
    containerd gives it) and holding only the blobs not in `have` (digests its content store
    holds). Returns the digests written."""
    have = set(have)
    entries, written = [], []
    with tarfile.open(fileobj=out, mode="w|") as tar:
        _add(tar, "oci-layout", OCI_LAYOUT)
        for name, image in images.items():
            entry = dict(image.descriptor())
            entry["annotations"] = {REF_NAME: name, CONTAINERD_NAME: name}
            entries.append(entry)
            for blob in image.blobs():
                digest = blob["digest"]
                if digest in have or digest in written:
                    continue
                tar.add(image.blob(digest), arcname=f"blobs/{digest.replace(':', '/', 1)}")
                written.append(digest)
        _add(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": entries}).encode())
    return written


def gc(layout: Path, keep: Iterable[str]) -> tuple[list[str], int]:
    """Keep the tags `keep` (those present) in index.json and the blobs they refer to; remove
    every other entry and blob. Returns (tags removed, bytes freed)."""
    keep = set(keep)
    if not (layout / "index.json").is_file():
        return [], 0
    found = tags(layout)
    kept = {tag: entry for tag, entry in found.items() if tag in keep}
    index = read_json(layout / "index.json")
    index["manifests"] = list(kept.values())
    partial = layout / "index.json.partial"
    partial.write_text(json.dumps(index, separators=(",", ":")))
    os.replace(partial, layout / "index.json")
    referenced = {blob["digest"].split(":", 1)[1] for tag in kept for blob in LayoutImage(layout, tag).blobs()}
    freed = 0
    for path in (layout / "blobs" / "sha256").iterdir():
        if path.name not in referenced:
            freed += path.stat().st_size
            path.unlink()
    return sorted(set(found) - set(kept)), freed


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "has":
        return 0 if argv[2] in tags(Path(argv[1])) else 1
    if len(argv) < 2 or argv[0] != "gc":
        print("usage: ocilayout.py has LAYOUT TAG | gc LAYOUT [TAG...]", file=sys.stderr)
        return 2
    removed, freed = gc(Path(argv[1]), argv[2:])
    print(f"layout {argv[1]}: kept {len(argv) - 2} tags, removed {removed or 'none'}, freed {freed // 2**20} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
