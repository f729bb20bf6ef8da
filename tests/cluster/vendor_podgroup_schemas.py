"""Regenerate tests/operator/schemas/podgroup-*.json: Kubernetes' own PodGroup spec schemas, one per
version the operator writes. scheduling.k8s.io/v1beta1 is read from the tests' control plane
(Kubernetes 1.37, the version install.sh pins), as it serves it: a served document carries enums
the published one lacks. v1alpha2 (1.36) was read the same way while the tests ran 1.36, and is
kept as it is; a missing one is read from the OpenAPI document published in the
k8s.io/kubernetes module on the Go proxy.

    .venv/bin/python tests/cluster/vendor_podgroup_schemas.py

The unit tests check the PodGroups the operator renders against these (tests/operator/
test_podgroup_schemas.py); a cluster test compares the v1beta1 one with the live 1.37 apiserver.
"""

from __future__ import annotations

import io
import json
import sys
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import controlplane  # noqa: E402
from support.podgroup_schemas import SCHEMAS, snapshot, source  # noqa: E402
from support.tools import control_plane  # noqa: E402

from kubetrain.api import k8s_schemas  # noqa: E402
from kubetrain.operator import podgroup  # noqa: E402

PROXY = "https://proxy.golang.org/k8s.io/kubernetes/@v/{version}.zip"


def openapi(version: str, api_version: str) -> dict[str, Any]:
    """The module's published OpenAPI v3 document of one scheduling.k8s.io version."""
    with urllib.request.urlopen(PROXY.format(version=version), timeout=300) as answer:
        archive = zipfile.ZipFile(io.BytesIO(answer.read()))
    group, short = api_version.split("/")
    name = f"k8s.io/kubernetes@{version}/api/openapi-spec/v3/apis__{group}__{short}_openapi.json"
    document: dict[str, Any] = json.loads(archive.read(name))
    return document


def served(api_version: str) -> dict[str, Any]:
    """The document the tests' control plane serves, with the PodGroup API turned on."""
    gates = dict.fromkeys(podgroup.FEATURE_GATES, True)
    with control_plane(scheduler=False, feature_gates=gates, runtime_config=[f"{api_version}=true"]) as cp:
        document: dict[str, Any] = json.loads(cp.kubectl("get", "--raw", source(api_version)).stdout)
    return document


def main() -> None:
    for (api_version, version), path in SCHEMAS.items():
        live = version == controlplane.pinned("K8S_VERSION")
        if not live and path.exists():
            print(f"kept {path} (read from a live {version} apiserver when the tests ran it)")
            continue
        document = served(api_version) if live else openapi(version, api_version)
        path.write_text(k8s_schemas.snapshot_text(snapshot(document, version, api_version)))
        print(f"wrote {path} ({path.stat().st_size} bytes, {'served' if live else 'published'})")


if __name__ == "__main__":
    main()
