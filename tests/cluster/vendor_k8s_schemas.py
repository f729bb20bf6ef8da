"""Regenerate api/k8s/core-v1-<version>.json from a real kube-apiserver.

    .venv/bin/python tests/cluster/vendor_k8s_schemas.py

Starts the test control plane (tests/cluster/install.sh's binaries), reads the apiserver's
OpenAPI v3 document for core/v1 and writes `kubetrain.api.k8s_schemas.structural()` of it.
The version in the file name is the one install.sh pins; tests/test_k8s_schemas.py fails
when the two differ, and tests/test_control_plane.py when the snapshot drifts from the apiserver.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import controlplane  # noqa: E402

from kubetrain.api import k8s_schemas  # noqa: E402


def fetch_openapi(cp: controlplane.ControlPlane) -> dict[str, Any]:
    """The apiserver's `/openapi/v3/api/v1` document, read as the admin user."""
    document: dict[str, Any] = json.loads(cp.kubectl("get", "--raw", k8s_schemas.SOURCE).stdout)
    return document


def main() -> None:
    with controlplane.running() as cp:
        snapshot = k8s_schemas.structural(fetch_openapi(cp), controlplane.pinned("K8S_VERSION"))
    target = ROOT / "api" / "k8s" / f"core-v1-{snapshot['kubernetesVersion']}.json"
    target.write_text(k8s_schemas.snapshot_text(snapshot))
    print(f"wrote {target} ({target.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
