"""The clusters the end-to-end scenario (tests/e2e/test_cluster_e2e.py) runs on, chosen by
KUBETRAIN_E2E_PROVIDER:

- `node` (default): a real kubelet node on its own control plane (support.node), with the
  images built from our Dockerfile (support.images) imported into its containerd and a
  hostPath PersistentVolume for each example's PVC.
- `kind`: the current kubeconfig context, a kind cluster that tests/e2e/kind-e2e.sh created
  and loaded both images into; its default StorageClass binds the PVCs.

Both give the scenario the same few things: kubectl and helm against the cluster, a volume
for a PVC, and what the provider itself can tell about a failure.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from support.controlplane import ToolError, Unavailable
from support.tools import which

PROVIDER_ENV = "KUBETRAIN_E2E_PROVIDER"
PROVIDERS = ("node", "kind")
KUBEPODS_MEMORY = Path("/sys/fs/cgroup/memory/kubepods")


class Provider(Protocol):
    name: str
    kubeconfig: Path | None  # None: the current kubeconfig (KUBECONFIG, ~/.kube/config)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]: ...

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]: ...

    def volume(self, name: str) -> None:
        """Make sure a PVC without a storage class can bind (to a volume called `name`)."""

    def describe_failure(self) -> str: ...

    def memory_mib(self) -> dict[str, float]:
        """Resident memory now, MiB, by part (empty: not measurable here)."""


@dataclass
class NodeProvider:
    node: Any  # support.node.RealNode
    name: str = "node"

    @property
    def kubeconfig(self) -> Path | None:
        return Path(self.node.cp.kubeconfig)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self.node.cp.kubectl(*args, input=input, check=check, timeout=timeout)

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self.node.cp.helm(*args, input=input, check=check, timeout=timeout)

    def volume(self, name: str) -> None:
        self.node.hostpath_volume(name)

    def describe_failure(self) -> str:
        return str(self.node.describe_failure())

    def memory_mib(self) -> dict[str, float]:
        """The node's and control plane's processes, and every pod's containers (the kubelet's
        `kubepods` memory cgroup, cgroup v1: its total_rss, not the page cache)."""
        stat = KUBEPODS_MEMORY / "memory.stat"
        rss = next((line.split()[1] for line in _lines(stat) if line.startswith("total_rss ")), "0")
        return {"processes": float(sum(self.node.rss_mib().values())), "pods": int(rss) / 2**20}


@dataclass
class KindProvider:
    kubectl_bin: str
    helm_bin: str
    name: str = "kind"
    kubeconfig: Path | None = None

    def _run(
        self, tool: str, args: tuple[str, ...], input: str | None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([tool, *args], input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ToolError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self._run(self.kubectl_bin, args, input, check, timeout)

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self._run(self.helm_bin, args, input, check, timeout)

    def volume(self, name: str) -> None:
        """kind's default StorageClass (local-path) provisions one per PVC."""

    def describe_failure(self) -> str:
        nodes = self.kubectl("get", "nodes", "-o", "wide", check=False)
        return nodes.stdout + nodes.stderr

    def memory_mib(self) -> dict[str, float]:
        return {}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


@contextmanager
def provider() -> Iterator[Provider]:
    """The provider KUBETRAIN_E2E_PROVIDER names, running; Unavailable names what is missing."""
    name = os.environ.get(PROVIDER_ENV, "node")
    if name == "node":
        yield from _node()
    elif name == "kind":
        yield _kind()
    else:
        raise ValueError(f"{PROVIDER_ENV}={name!r}: expected one of {', '.join(PROVIDERS)}")


def _node() -> Iterator[Provider]:
    from support import images, node

    loadables = images.node_images()  # before the node starts: a missing image is a quick skip
    with node.running_node() as real:
        real.load_images(loadables)
        yield NodeProvider(real)


def _kind() -> Provider:
    kubectl, helm = which("kubectl"), which("helm")
    if kubectl is None or helm is None:
        raise Unavailable("the kind provider needs kubectl and helm on PATH")
    context = subprocess.run([kubectl, "config", "current-context"], capture_output=True, text=True, timeout=30)
    if not context.stdout.startswith("kind-"):
        raise Unavailable(
            f"the kind provider needs a kind cluster as the current context (have {context.stdout.strip()!r}): "
            "bash tests/e2e/kind-e2e.sh creates it"
        )
    return KindProvider(kubectl, helm)
