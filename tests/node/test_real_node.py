"""A real node (containerd + runc + kubelet + CoreDNS, tests/support/node.py) runs real pods:
a FROM-scratch image reaches Running under Pod Security `restricted`, `kubectl logs` streams
through the kubelet, pods resolve headless-Service names and reach the apiserver at the
`kubernetes` Service IP, a hostPath PV binds and is writable by a non-root pod, and pods have
no default route."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
from pathlib import Path

import pytest
from support import ociimage
from support.controlplane import ToolError
from support.node import RealNode
from support.nodeconfig import KUBERNETES_SERVICE_IP, POD_CIDR, SERVICE_CIDR
from support.nodepods import SCRATCH_IMAGE, pod_logs, restricted_namespace, run_pod, scratch_pod
from support.waiting import wait_for

pytestmark = pytest.mark.node


def test_scratch_pod_runs_and_kubectl_logs_reads_it_through_the_kubelet(real_node: RealNode) -> None:
    ns = restricted_namespace(real_node, "logs")
    seconds = run_pod(real_node, ns, scratch_pod("hello", ["hello", "3"]))
    print(f"\nscratch pod create -> Running: {seconds:.1f} s")
    wait_for(lambda: pod_logs(real_node, ns, "hello").count("\n") == 3, 30, "3 log lines")
    assert pod_logs(real_node, ns, "hello") == "".join(f"hello {i} from hello\n" for i in range(1, 4))
    ip = real_node.cp.kubectl("get", "pod", "hello", "-n", ns, "-o", "jsonpath={.status.podIP}").stdout
    assert ip.startswith(POD_CIDR.split(".0.0/")[0] + "."), ip
    # exec streams through the kubelet too: the program's usage error and exit code come back.
    done = real_node.cp.kubectl("exec", "hello", "-n", ns, "--", "/scratch", check=False)
    assert (done.returncode, done.stderr.splitlines()[0]) == (
        2,
        "usage: scratch hello N | resolve NAME [PORT] | touch PATH",
    )


def test_describe_failure_shows_every_log_the_node_conditions_and_events(real_node: RealNode) -> None:
    text = real_node.describe_failure(tail_lines=5)
    for part in ("--- containerd.log", "--- kubelet.log", "--- coredns.log", "--- kube-apiserver.log",
                 "Ready=True KubeletReady", "--- kubectl get events", "--- kubectl get pods"):  # fmt: skip
        assert part in text, part


def test_pod_resolves_a_headless_service_name_and_reaches_the_apiserver(real_node: RealNode) -> None:
    ns = restricted_namespace(real_node, "dns")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "workers"},
        "spec": {"clusterIP": "None", "selector": {"app": "worker-0"}, "ports": [{"port": 29500}]},
    }
    real_node.cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(service))
    run_pod(real_node, ns, scratch_pod("worker-0", ["hello", "1"], hostname="worker-0", subdomain="workers"))
    worker_ip = real_node.cp.kubectl("get", "pod", "worker-0", "-n", ns, "-o", "jsonpath={.status.podIP}").stdout
    name = f"worker-0.workers.{ns}.svc.cluster.local"
    run_pod(real_node, ns, scratch_pod("peer", ["resolve", name]))
    run_pod(real_node, ns, scratch_pod("client", ["resolve", "kubernetes.default.svc.cluster.local", "443"]))
    wait_for(lambda: f"resolved {name} {worker_ip}\n" in pod_logs(real_node, ns, "peer"), 60, f"{name} resolved")
    expected = f"connected {KUBERNETES_SERVICE_IP}:443\n"
    wait_for(lambda: expected in pod_logs(real_node, ns, "client"), 30, "a connection to the kubernetes Service")


def test_hostpath_volume_binds_a_classless_claim_writable_by_a_non_root_pod(real_node: RealNode) -> None:
    ns = restricted_namespace(real_node, "volume")
    path = real_node.hostpath_volume("scratch-pv", size="1Gi")
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    real_node.cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(claim))
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    pod = scratch_pod("writer", ["touch", "/data/written"], volumes=volumes)
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    run_pod(real_node, ns, pod)
    wait_for(lambda: "wrote /data/written\n" in pod_logs(real_node, ns, "writer"), 30, "the pod's write", interval=0.2)
    assert (path / "written").stat().st_uid == 10001


def test_pods_have_no_default_route(real_node: RealNode) -> None:
    ns = restricted_namespace(real_node, "routes")
    run_pod(real_node, ns, scratch_pod("routes", ["hello", "1"]))
    tasks = [line.split() for line in real_node.ctr("tasks", "ls").stdout.splitlines()[1:]]
    pids = [int(row[1]) for row in tasks if row[2] == "RUNNING"]
    # Every container of the node, pause sandboxes included: /proc/<pid>/net/route is its netns'.
    tables = {pid: _routes(pid) for pid in pids}
    pod_tables = [routes for routes in tables.values() if routes != _routes(1)]
    assert pod_tables, tables
    for routes in pod_tables:
        assert "0.0.0.0/0" not in routes, routes
        assert {POD_CIDR, SERVICE_CIDR} <= set(routes), routes


def _routes(pid: int) -> list[str]:
    """Destinations in /proc/<pid>/net/route (hex little-endian address and mask)."""
    out = []
    for line in Path(f"/proc/{pid}/net/route").read_text().splitlines()[1:]:
        fields = line.split()
        dest = ipaddress.IPv4Address(int(fields[1], 16).to_bytes(4, "little"))
        mask = bin(int(fields[7], 16)).count("1")
        out.append(f"{dest}/{mask}")
    return out


def test_load_images_names_a_buildah_style_archive_and_skips_one_already_there(
    real_node: RealNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = "docker.io/kubetrain/scratch-test:1"
    binary = tmp_path / "hello"
    binary.write_bytes(b"#!/bin/false\n")
    archive = ociimage.scratch_image(ref, {"/hello": binary}, ["/hello"], tmp_path / "a.tar", ref_name_only=True)
    # containerd's store outlives the node: start from an image that is not there.
    with contextlib.suppress(ToolError):
        real_node.ctr("images", "rm", ref)
    assert real_node.load_images([archive]) == [ref]
    assert ref in real_node.images()
    calls: list[tuple[str, ...]] = []
    ctr = real_node.ctr

    def recording_ctr(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return ctr(*args, timeout=timeout)

    monkeypatch.setattr(real_node, "ctr", recording_ctr)
    assert real_node.load_images([archive]) == [ref]
    assert calls == [("images", "ls")]


def test_prune_images_removes_an_image_whose_name_moved_to_a_rebuild(real_node: RealNode, tmp_path: Path) -> None:
    ref = "docker.io/kubetrain/rebuilt:1"
    digests = []
    for build in ("old", "new"):
        binary = tmp_path / build
        binary.write_bytes(f"the {build} build\n".encode())
        real_node.ctr(
            "images", "import", str(ociimage.scratch_image(ref, {"/b": binary}, ["/b"], tmp_path / f"{build}.tar"))
        )
        digests.append(real_node.images()[ref])
        # What keeps an old build alive once its name moves: containerd's CRI refers to every
        # image it found at its start by id (sha256:<id>) and to pulled ones by digest; the
        # digest reference stands in for both here (ctr cannot write an id reference).
        real_node.ctr("images", "tag", "--force", ref, f"{ref.rpartition(':')[0]}@{digests[-1]}")
    old, new = digests
    before = real_node.images()
    assert {before[r] for r in real_node.prune_images()} == {old}
    after = real_node.images()
    assert after[ref] == new and after[f"docker.io/kubetrain/rebuilt@{new}"] == new
    assert SCRATCH_IMAGE in after
