"""Pods of the real-node tests (tests/node/): the workload is one static C program
(tests/node/scratch.c) alone in a FROM-scratch image, run under Pod Security `restricted`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from support import node as real
from support import ociimage
from support.node import RealNode
from support.waiting import wait_for

SCRATCH_IMAGE = "kubetrain.test/scratch:1"
SCRATCH_SOURCE = Path(__file__).resolve().parents[1] / "node" / "scratch.c"
# What Pod Security `restricted` asks of every container.
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def node_or_skip() -> None:
    reason = real.missing()
    if reason:
        # A `cluster` test: under KUBETRAIN_REQUIRE_CONTROL_PLANE=1 this skip is a failure.
        pytest.skip(f"no real node: {reason}")


def scratch_archive(out: Path) -> Path:
    """Compile scratch.c statically and write it as the FROM-scratch image SCRATCH_IMAGE."""
    subprocess.run(
        ["gcc", "-Os", "-static", "-o", str(out / "scratch"), str(SCRATCH_SOURCE)], check=True, capture_output=True
    )
    return ociimage.scratch_image(SCRATCH_IMAGE, {"/scratch": out / "scratch"}, ["/scratch"], out / "scratch.tar")


def restricted_namespace(node: RealNode, name: str) -> str:
    node.cp.kubectl("create", "namespace", name)
    node.cp.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    wait_for(lambda: node.cp.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
             30, f"the default ServiceAccount in {name}")  # fmt: skip
    return name


def scratch_pod(name: str, args: list[str], **spec: Any) -> dict[str, Any]:
    """A pod running the scratch program with `args`, admissible under `restricted`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": SCRATCH_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": args,
                    "securityContext": RESTRICTED,
                    "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}},
                }
            ],
            **spec,
        },
    }


def run_pod(node: RealNode, namespace: str, pod: dict[str, Any], timeout: float = 90) -> float:
    """Create `pod` and wait until it is Running; the seconds that took. A timeout raises with
    the node's diagnostics."""
    t0 = time.monotonic()
    node.cp.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))

    def running() -> bool:
        phase = node.cp.kubectl(
            "get", "pod", pod["metadata"]["name"], "-n", namespace, "-o", "jsonpath={.status.phase}"
        )
        return phase.stdout == "Running"

    try:
        wait_for(running, timeout, f"pod {namespace}/{pod['metadata']['name']} Running", interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{node.describe_failure()}") from exc
    return time.monotonic() - t0


def pod_logs(node: RealNode, namespace: str, name: str) -> str:
    return node.cp.kubectl("logs", name, "-n", namespace).stdout
