"""The real node's processes (tests/support/node.py is the entry point: `running_node()`):
a `RealNode` with what tests do on it (images, volumes, diagnostics), and the steps that start
and stop it. Started in this order: a control plane whose apiserver can reach the kubelet, the
bridge and the apiserver relay, containerd with the pause image, the kubelet (until the Node is
Ready), CoreDNS (until it answers). Stopped: pods first (the kubelet cleans up after them),
then the kubelet, CoreDNS, the relay, containerd and its shims, the control plane.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support import controlplane, dnsquery, hoststate, nodeconfig, ociimage, ocilayout
from support.controlplane import ControlPlane
from support.daemons import Daemons
from support.nodeconfig import BRIDGE, KUBERNETES_SERVICE_IP, NODE_IP, NodePaths
from support.ocilayout import LayoutImage
from support.waiting import wait_for

NODE_NAME = "kubetrain-node"
# The relay's chain in the nat table: DNATs the `kubernetes` Service IP to socat on the bridge.
RELAY_CHAIN = "KUBETRAIN-NODE"
RELAY_PORT = 443
START_TIMEOUT = 120


def node_bin_dir() -> Path:
    return controlplane.cache_dir() / f"node-{controlplane.pinned('KUBELET_VERSION')}"


def coredns_bin() -> Path:
    return controlplane.cache_dir() / f"coredns-{controlplane.pinned('COREDNS_VERSION')}" / "coredns"


def image_store() -> Path:
    """containerd's root (content + snapshots), kept between runs: imports happen once."""
    return controlplane.cache_dir() / "node-containerd-root"


def control_plane_flags(kubelet_client_pki: Path) -> list[str]:
    """apiserver flags for a control plane with this node: it reaches the kubelet (logs, exec,
    port-forward) at the Node's InternalIP with a client cert the kubelet trusts."""
    return [
        f"--kubelet-client-certificate={kubelet_client_pki / 'admin.crt'}",
        f"--kubelet-client-key={kubelet_client_pki / 'admin.key'}",
        "--kubelet-preferred-address-types=InternalIP",
    ]


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise controlplane.ToolError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return proc


@dataclass
class RealNode(Daemons):
    """A running node. `cp` is its control plane (kubeconfig, kubectl(), helm()); `name` the
    Node's name; `workdir` holds configs, logs (workdir/logs) and hostPath volumes."""

    cp: ControlPlane
    name: str
    paths: NodePaths
    # The host before the node started (hoststate.snapshot(self.host_roots)).
    host_before: dict[str, Any] = field(default_factory=dict)

    @property
    def host_roots(self) -> list[Path]:
        """The node's own directories: mounts under them are the node's."""
        return [self.workdir, self.paths.store]

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "--address", str(self.paths.containerd_socket), "-n", "k8s.io", *args, timeout=timeout)

    def images(self) -> dict[str, str]:
        """{image name: manifest digest} in containerd's k8s.io namespace."""
        rows = [line.split() for line in self.ctr("images", "ls").stdout.splitlines()[1:]]
        return {row[0]: row[2] for row in rows if len(row) > 2}

    def load_images(self, images: Sequence[Path | tuple[str, LayoutImage]]) -> list[str]:
        """Import images into the node: OCI archives (`ociimage.scratch_image`, a tar named by
        its io.containerd.image.name or org.opencontainers.image.ref.name annotation), and
        (name, layout image) pairs, imported under `name` with only the blobs containerd lacks
        (tests/support/ocilayout.py). An image already there with the same digest is skipped.
        Returns the names of the images."""
        names: list[str] = []
        layout = {name: image for item in images if isinstance(item, tuple) for name, image in [item]}
        for archive in (item for item in images if isinstance(item, Path)):
            wanted = ociimage.archive_images(archive)
            names += self._import(str(archive), wanted, lambda archive=archive: self._import_archive(archive))
        if layout:
            wanted = {name: image.descriptor()["digest"] for name, image in layout.items()}
            names += self._import(", ".join(map(str, layout.values())), wanted, lambda: self._import_layout(layout))
        return names

    def _import(self, what: str, wanted: dict[str, str], load: Callable[[], None]) -> list[str]:
        present = self.images()
        if not wanted or any(present.get(name) != digest for name, digest in wanted.items()):
            load()
            present = self.images()
        absent = [name for name, digest in wanted.items() if present.get(name) != digest]
        if absent or not wanted:
            raise RuntimeError(f"{what}: import did not produce {absent or 'any named image'}; have {sorted(present)}")
        return list(wanted)

    def _import_archive(self, archive: Path) -> None:
        self.ctr("images", "import", str(archive))

    def _import_layout(self, images: dict[str, LayoutImage]) -> None:
        """One `ctr images import -` fed a stream with the blobs the content store lacks."""
        have = self.ctr("content", "ls", "-q").stdout.split()
        argv = ["ctr", "--address", str(self.paths.containerd_socket), "-n", "k8s.io", "images", "import", "-"]
        with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            # ctr stops reading when it fails: its own error says why, below.
            with contextlib.suppress(BrokenPipeError):
                ocilayout.import_stream(proc.stdin, images, have)
                proc.stdin.close()
            output = proc.stdout.read().decode(errors="replace")
            if proc.wait(timeout=600) != 0:
                raise controlplane.ToolError(proc.returncode, argv, output, "")

    def prune_images(self) -> list[str]:
        """Remove the images no name points to any more: an import under an existing name
        (a rebuilt trainer) moves the name, but containerd's CRI also refers to every image by
        its id (sha256:...), which would keep the older build's gigabytes in the store (it
        outlives the node) forever. Images other sessions loaded under their names stay.
        Returns the references removed."""
        images = self.images()
        named = {digest for ref, digest in images.items() if not ref.startswith("sha256:") and "@sha256:" not in ref}
        stale = sorted(ref for ref, digest in images.items() if digest not in named)
        if stale:
            self.ctr("images", "rm", "--sync", *stale)
        return stale

    def hostpath_volume(self, pv_name: str, size: str = "1Gi") -> Path:
        """A directory (mode 0777: pods run as non-root uids and fsGroup does not apply to
        hostPath) and a PersistentVolume with no storageClassName on it, which a PVC without
        a class binds to. Returns the directory."""
        path = self.workdir / "volumes" / pv_name
        path.mkdir(parents=True)
        path.chmod(0o777)
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "Directory"},
            },
        }
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(pv))
        return path

    def rss_mib(self) -> dict[str, float]:
        """Resident memory of every node and control-plane process, MiB."""
        procs = {**self.cp.processes, **self.processes}
        return {name: _rss_mib(p.pid) for name, p in procs.items() if p.poll() is None}

    def describe_failure(self, tail_lines: int = 40) -> str:
        """Log tails of the node's processes and control plane, node conditions, pods, events."""
        parts = [f"node logs in {self.logs}", *self.log_tails(tail_lines), self.cp.describe_failure(tail_lines)]
        conditions = "{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{'\\n'}{end}"
        for args in (
            ("get", "node", self.name, "-o", "jsonpath=taints: {.spec.taints}{'\\n'}" + conditions),
            ("get", "pods", "-A", "-o", "wide"),
            ("get", "events", "-A", "--sort-by=.lastTimestamp"),
        ):
            out = self.cp.kubectl(*args, check=False, timeout=20)
            text = "\n".join((out.stdout + out.stderr).splitlines()[-tail_lines:])
            parts.append(f"--- kubectl {' '.join(args[:3])}\n{text}")
        return "\n".join(parts)

    # --- lifecycle -----------------------------------------------------------------------
    def _wait(
        self, what: str, ready: Callable[[], object], timeout: float = START_TIMEOUT, interval: float = 0.2
    ) -> None:
        """Until `ready()`, timed from the start (`timings`)."""
        super()._wait(what, ready, timeout, interval)
        self.timings[what] = time.monotonic() - self.timings["t0"]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _kubelet_pki(node: RealNode) -> None:
    """The kubelet's identity: a client cert from the control plane's CA in group system:nodes
    (bound to the system:node role: the apiserver authorizes with RBAC only)."""
    pki = node.cp.workdir / "pki"
    controlplane._signed_cert(
        "node",
        f"/O=system:nodes/CN=system:node:{node.name}",
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
        pki,
    )
    controlplane.write_kubeconfig(node.workdir / "kubelet.kubeconfig", node.cp.server, pki, "node")
    node.cp.kubectl(
        "create", "clusterrolebinding", "kubetrain-node", "--clusterrole=system:node", "--group=system:nodes"
    )


def _start_containerd(node: RealNode) -> None:
    pause_version = (node_bin_dir() / "pause.version").read_text().strip()
    sandbox_image = f"registry.k8s.io/pause:{pause_version}"
    config = node.workdir / "containerd.toml"
    config.write_text(nodeconfig.toml(nodeconfig.containerd_config(node.paths, sandbox_image=sandbox_image)))
    node.paths.cni_conf_dir.mkdir(parents=True)
    (node.paths.cni_conf_dir / "10-kubetrain.conflist").write_text(json.dumps(nodeconfig.cni_network(node.paths)))
    node._spawn("containerd", ["containerd", "--config", str(config)])
    # containerd answers before its CRI plugin has recovered its state (0.6 s with a few
    # images), and a kubelet started then exits ("server is not initialized yet"). The CRI
    # logs this line last, just before it serves; no CRI client is at hand to ask it instead.
    log = node.logs / "containerd.log"
    node._wait("containerd", lambda: 'msg="Start streaming server"' in log.read_text(errors="replace"))
    pause = ociimage.scratch_image(
        sandbox_image, {"/pause": node_bin_dir() / "pause"}, ["/pause"], node.workdir / "pause.tar"
    )
    node.load_images([pause])


def _start_network(node: RealNode) -> None:
    """The bridge with the node IP (before any pod, so that the kubelet, CoreDNS and the relay
    can bind it), and the relay: the `kubernetes` Service IP DNATed to socat on the bridge,
    which forwards to the apiserver on loopback (no kube-proxy here)."""
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{NODE_IP}/{nodeconfig.POD_CIDR.split('/')[1]}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    _run("iptables", "-t", "nat", "-N", RELAY_CHAIN)
    _run("iptables", "-t", "nat", "-A", RELAY_CHAIN, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp",
         "--dport", "443", "-j", "DNAT", "--to-destination", f"{NODE_IP}:{RELAY_PORT}")  # fmt: skip
    _run("iptables", "-t", "nat", "-I", "PREROUTING", "-j", RELAY_CHAIN)


def clear_stale() -> list[str]:
    """Remove the bridge and relay chain of a node that was killed before its teardown (they
    carry fixed names, and the host lock says no node runs now); what was found."""
    found = []
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
        _run("ip", "link", "delete", BRIDGE)
        found.append(f"bridge {BRIDGE}")
    if subprocess.run(["iptables", "-t", "nat", "-L", RELAY_CHAIN], capture_output=True).returncode == 0:
        _run("iptables", "-t", "nat", "-D", "PREROUTING", "-j", RELAY_CHAIN, check=False)
        _run("iptables", "-t", "nat", "-F", RELAY_CHAIN)
        _run("iptables", "-t", "nat", "-X", RELAY_CHAIN)
        found.append(f"iptables nat chain {RELAY_CHAIN}")
    # Its pods' cgroups: the kubelet made them, nobody removed them. A cgroup that still holds a
    # task refuses and stays (then the node's own check names what it finds).
    stale_cgroups = hoststate.kubepods_cgroups()
    if stale_cgroups:
        hoststate.undo_cgroups({"cgroups": []})
        gone = [c for c in stale_cgroups if not Path(c).exists()]
        if gone:
            found.append(f"kubepods cgroups in {len(gone)} hierarchies")
    return found


def _start_relay(node: RealNode) -> None:
    api = node.cp.server.removeprefix("https://")
    node._spawn("relay", ["socat", f"TCP-LISTEN:{RELAY_PORT},bind={NODE_IP},fork,reuseaddr", f"TCP:{api}"])


def _start_kubelet(node: RealNode, client_pki: Path) -> None:
    port, healthz = controlplane.free_ports(2)
    resolv = node.workdir / "resolv.conf"
    resolv.write_text("# no nameserver: pods resolve through the cluster DNS only\n")
    config = nodeconfig.kubelet_config(node.paths, port=port, healthz_port=healthz,
                                       client_ca=client_pki / "ca.crt", resolv_conf=resolv)  # fmt: skip
    (node.workdir / "kubelet.yaml").write_text(yaml.safe_dump(config))
    node._spawn(
        "kubelet",
        [
            str(node_bin_dir() / "kubelet"),
            f"--config={node.workdir / 'kubelet.yaml'}",
            f"--kubeconfig={node.workdir / 'kubelet.kubeconfig'}",
            f"--root-dir={node.paths.kubelet_root}",
            f"--cert-dir={node.workdir / 'kubelet-pki'}",
            f"--hostname-override={node.name}",
            f"--node-ip={NODE_IP}",
            "--v=1",
        ],
    )

    def ready() -> bool:
        got = node.cp.kubectl("get", "node", node.name, "-o",
                              "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)  # fmt: skip
        return got.stdout.strip() == "True"

    node._wait("node Ready", ready)
    # The kubelet registers the node tainted not-ready; the node-lifecycle controller lifts the
    # taint once the node is Ready, but this control plane does not run it (its other tests'
    # nodes are fakes without heartbeats). Lifted here, as it would.
    node.cp.kubectl("taint", "node", node.name, "node.kubernetes.io/not-ready-")


def _start_coredns(node: RealNode) -> None:
    ready_port, health_port = controlplane.free_ports(2)
    corefile = node.workdir / "Corefile"
    corefile.write_text(nodeconfig.corefile(kubeconfig=node.cp.kubeconfig, context="kubetrain-test",
                                            ready_port=ready_port, health_port=health_port))  # fmt: skip
    node._spawn("coredns", [str(coredns_bin()), "-conf", str(corefile)])
    name = f"kubernetes.default.svc.{nodeconfig.CLUSTER_DOMAIN}"
    node._wait("coredns answers", lambda: dnsquery.query_a(NODE_IP, name, timeout=1) == [KUBERNETES_SERVICE_IP])


def start(workdir: Path, started: list[RealNode]) -> RealNode:
    """Start a control plane and a node on it. The caller holds host_lock and calls teardown,
    also when this raises: `started` gets the node as soon as it exists."""
    t0 = time.monotonic()
    client_pki = workdir / "kubelet-client-pki"
    controlplane.make_pki(client_pki)
    cp = controlplane.start(workdir / "control-plane", scheduler=True, apiserver_flags=control_plane_flags(client_pki))
    node = RealNode(cp=cp, name=NODE_NAME, workdir=workdir, paths=NodePaths(workdir, image_store()))
    node.timings["t0"] = t0
    node.timings["control plane"] = time.monotonic() - t0
    node.logs.mkdir()
    started.append(node)
    _start_network(node)
    _start_relay(node)
    _kubelet_pki(node)
    _start_containerd(node)
    _start_kubelet(node, client_pki)
    _start_coredns(node)
    return node


def _delete_pods(node: RealNode) -> None:
    """Delete every pod and wait until containerd runs no container: the kubelet then has torn
    down their sandboxes, networks and volumes itself. The controllers and the scheduler stop
    first, so that nothing replaces a pod (a Deployment's, an operator's)."""
    for name in ("kube-scheduler", "kube-controller-manager"):
        proc = node.cp.processes.get(name)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
    node.cp.kubectl("delete", "pods", "--all", "-A", "--grace-period=0", "--force", "--wait=false", check=False)
    with contextlib.suppress(AssertionError, OSError, subprocess.SubprocessError):
        wait_for(lambda: not node.ctr("tasks", "ls", "-q", timeout=10).stdout.strip(), 60, "pods gone", interval=0.5)


def _stop_runtime(node: RealNode) -> None:
    """Images no name points to pruned; whatever the kubelet left: tasks killed, then
    containerd, then its shims (they outlive containerd while a task runs; found by the
    socket path in their command line)."""
    tasks: list[str] = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        node.prune_images()
        tasks = node.ctr("tasks", "ls", "-q", timeout=10).stdout.split()
    for task in tasks:
        # A task that already stopped refuses the kill: delete it all the same.
        for args in (("kill", "-s", "SIGKILL", task), ("delete", "-f", task)):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                node.ctr("tasks", *args, timeout=10)
    node._stop_process("containerd")
    marker = str(node.paths.containerd_socket).encode()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            if b"containerd-shim" in cmdline and marker in cmdline:
                os.kill(int(proc.name), 9)


def teardown(node: RealNode) -> None:
    """Stop the node and its control plane (pods first, so the kubelet cleans up after them)."""
    t0 = time.monotonic()
    with contextlib.suppress(Exception):
        _delete_pods(node)
    for name in ("kubelet", "coredns", "relay"):
        node._stop_process(name)
    _stop_runtime(node)
    node.cp.stop()
    node.timings["teardown"] = time.monotonic() - t0
