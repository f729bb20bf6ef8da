"""The images the real-node tests run, as OCI archives for a real node's containerd: the two of
the repository's Dockerfile, and the guest, a user's own image (torch, transformers, accelerate,
Lightning; no kubetrain, no pydantic) built as one layer on the trainer.

tests/cluster/build-images.sh builds them (as root, with buildah, cached by content); this module
only asks it, with `--print`, which archives belong to the CURRENT sources, so the content key
is computed in one place. The refs are the names containerd resolves the chart's
`kubetrain/operator:0.1.0` and the example's `kubetrain/trainer:0.1.0-cpu` to. The guest is in the
trainer's archive (one OCI layout, blobs shared): both refs map to the same path, and importing
that archive once names both.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.controlplane import Unavailable
from support.tools import ROOT

BUILD_SCRIPT = ROOT / "tests" / "cluster" / "build-images.sh"
OPERATOR_REF = "docker.io/kubetrain/operator:0.1.0"
TRAINER_REF = "docker.io/kubetrain/trainer:0.1.0-cpu"
GUEST_REF = "docker.io/kubetrain/guest:0.1.0-cpu"
# The script's last lines, in this order.
_KEYS = {
    "OPERATOR_IMAGE_ARCHIVE": OPERATOR_REF,
    "TRAINER_IMAGE_ARCHIVE": TRAINER_REF,
    "GUEST_IMAGE_ARCHIVE": GUEST_REF,
}


def expected_archives(root: Path = ROOT, env: dict[str, str] | None = None) -> dict[str, Path]:
    """Image ref -> the archive path the sources under `root` key to (it may not exist yet)."""
    script = root / "tests" / "cluster" / "build-images.sh"
    result = subprocess.run(
        ["bash", str(script), "--print"], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    found: dict[str, Path] = {}
    for line in result.stdout.splitlines():
        key, _, value = line.partition("=")
        if key in _KEYS:
            found[_KEYS[key]] = Path(value)
    if set(found) != set(_KEYS.values()):
        raise RuntimeError(f"{script} --print did not name every image's archive:\n{result.stdout}{result.stderr}")
    return found


def archives(*refs: str) -> dict[str, Path]:
    """Image ref -> OCI archive of the current sources, for `refs` (default: every image; the
    trainer's and the guest's are one archive); Unavailable when one is not built."""
    found = {ref: path for ref, path in expected_archives().items() if ref in (refs or _KEYS.values())}
    missing = [f"{ref} ({path})" for ref, path in found.items() if not path.is_file()]
    if missing:
        raise Unavailable(f"images not built for the current sources: {', '.join(missing)}; run: bash {BUILD_SCRIPT}")
    return found
