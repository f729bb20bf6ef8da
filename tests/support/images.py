"""The images the real-node tests run, in one OCI image layout (tests/support/ocilayout.py) a real
node's containerd imports from: the two of the repository's Dockerfile, and the guest, a user's own
image (torch, transformers, accelerate, Lightning; no kubetrain, no pydantic) built as one layer on
the Dockerfile's trainer-deps stage.

tests/cluster/build-images.sh builds them (as root, with buildah, cached by content); this module
only asks it, with `--print`, which images belong to the CURRENT sources, so the content key is
computed in one place. The refs are the names containerd resolves the chart's
`kubetrain/operator:0.1.0` and the example's `kubetrain/trainer:0.1.0-cpu` to.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from support.controlplane import Unavailable
from support.ocilayout import LayoutImage
from support.tools import ROOT

BUILD_SCRIPT = ROOT / "tests" / "cluster" / "build-images.sh"
OPERATOR_REF = "docker.io/kubetrain/operator:0.1.0"
TRAINER_REF = "docker.io/kubetrain/trainer:0.1.0-cpu"
GUEST_REF = "docker.io/kubetrain/guest:0.1.0-cpu"
# What the script reads: the Dockerfile's build context, the script and the guest's recipe.
BUILD_INPUTS = [
    "Dockerfile",
    ".dockerignore",
    "pyproject.toml",
    "README.md",
    "api",
    "operator",
    "local",
    "runtime",
    "trainer",
]
BUILD_INPUTS += ["cli", "client", "examples", "tests/cluster/build-images.sh", "tests/cluster/guest.Dockerfile"]
BUILD_INPUTS += ["tests/support/ocilayout.py"]
# The script's last lines, in this order.
_KEYS = {
    "OPERATOR_IMAGE": OPERATOR_REF,
    "TRAINER_IMAGE": TRAINER_REF,
    "GUEST_IMAGE": GUEST_REF,
}


def expected_images(root: Path = ROOT, env: dict[str, str] | None = None) -> dict[str, LayoutImage]:
    """Image ref -> the layout image the sources under `root` key to (it may not be built yet)."""
    script = root / "tests" / "cluster" / "build-images.sh"
    result = subprocess.run(
        ["bash", str(script), "--print"], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    return parse_printed(result.stdout, f"{script} --print")


def parse_printed(stdout: str, what: str) -> dict[str, LayoutImage]:
    """Image ref -> layout image, from the script's last lines (a build's or --print's)."""
    found: dict[str, LayoutImage] = {}
    for line in stdout.splitlines():
        key, _, value = line.partition("=")
        if key in _KEYS:
            found[_KEYS[key]] = LayoutImage.parse(value)
    if set(found) != set(_KEYS.values()):
        raise RuntimeError(f"{what} did not name every image:\n{stdout}")
    return found


def built(*refs: str) -> dict[str, LayoutImage]:
    """Image ref -> the layout image of the current sources, for `refs` (default: every image);
    Unavailable when one is not built."""
    found = {ref: image for ref, image in expected_images().items() if ref in (refs or _KEYS.values())}
    missing = [f"{ref} ({image})" for ref, image in found.items() if not image.exists()]
    if missing:
        raise Unavailable(f"images not built for the current sources: {', '.join(missing)}; run: bash {BUILD_SCRIPT}")
    return found


# What RealNode.load_images takes: an OCI archive's path, or (the name to give it, a layout image).
Loadable = Path | tuple[str, LayoutImage]


def loadable(ref: str, spec: str) -> Loadable:
    """An image named by hand for `ref`: `oci:<layout>:<tag>` (as build-images.sh prints it) or the
    path of an OCI archive."""
    return (ref, LayoutImage.parse(spec)) if spec.startswith("oci:") else Path(spec)


def node_images(*refs: str) -> list[Loadable]:
    """`built(*refs)` as RealNode.load_images takes it."""
    return list(built(*refs).items())


def copy_build_inputs(into: Path, *more: str) -> Path:
    """A copy of BUILD_INPUTS (and `more` paths) of this tree at `into`, without caches: a tree
    the script builds as it would this one, for a change to be tried on."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in [*BUILD_INPUTS, *more]:
        source, target = ROOT / name, into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignore)
        else:
            shutil.copy2(source, target)
    return into
