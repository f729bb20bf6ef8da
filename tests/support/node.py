"""A real single Kubernetes node on this machine: containerd + runc + bridge CNI + a kubelet +
CoreDNS, joined to its own control plane (with kube-scheduler). Pods run as real containers
from images imported with `ctr`; `kubectl logs/exec` go through the kubelet; pods resolve
<pod>.<headless-svc>.<ns>.svc.cluster.local; in-cluster clients reach the apiserver at the
`kubernetes` Service IP through a relay. Needs root (see `missing()`).

    with running_node() as node:
        node.load_images([archive])
        node.cp.kubectl("apply", "-f", ...)

One node per host at a time (a file lock); on exit everything is torn down and the host is
checked against a snapshot taken before (tests/support/hoststate.py): a difference raises.
Processes are in tests/support/realnode.py, configuration in tests/support/nodeconfig.py;
binaries come from tests/cluster/install.sh.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support import controlplane, hoststate
from support.controlplane import Unavailable
from support.nodeconfig import BRIDGE
from support.realnode import (
    RealNode,
    clear_stale,
    control_plane_flags,
    coredns_bin,
    image_store,
    node_bin_dir,
    start,
    teardown,
)

# What tests use from here: the provider, the node and the apiserver flags it needs.
__all__ = ["RealNode", "control_plane_flags", "host_lock", "missing", "running_node"]

CNI_BIN = Path("/usr/lib/cni")
COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "socat", "iptables", "iptables-save", "ip", "gcc")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
DEBIAN_PACKAGES = "containerd runc containernetworking-plugins socat iptables gcc libc6-dev"


def missing() -> str | None:
    """What this machine lacks for a real node, or None: for skip reasons."""
    install = "run `bash tests/cluster/install.sh` as root"
    if os.geteuid() != 0:
        return "a real node needs root (containerd, network namespaces, mounts, iptables)"
    commands = [c for c in COMMANDS if shutil.which(c) is None]
    if commands:
        return f"missing {', '.join(commands)} (Debian packages {DEBIAN_PACKAGES}: {install})"
    plugins = [p for p in CNI_PLUGINS if not (CNI_BIN / p).exists()]
    if plugins:
        return f"missing CNI plugins {', '.join(plugins)} in {CNI_BIN} (containernetworking-plugins: {install})"
    if not (node_bin_dir() / ".complete").exists() or not coredns_bin().exists():
        return f"kubelet, pause or coredns not built under {controlplane.cache_dir()} ({install})"
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no memory cgroup controller under /sys/fs/cgroup (the kubelet needs cpu and memory)"
    try:
        controlplane.find_k8s_bin()
    except Unavailable as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """One real node per host: its bridge, IPs and ports are fixed. A second one waits."""
    path = controlplane.cache_dir() / "node.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            print(f"waiting for the real node held by {lock.read().strip()} (lock {path})", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}\n")
        lock.flush()
        yield


@contextlib.contextmanager
def running_node(workdir: Path | None = None) -> Iterator[RealNode]:
    """A control plane with a Ready node, CoreDNS answering and the apiserver relay up. On exit
    everything is stopped, the host's leftovers undone and the host compared with its state
    before: RuntimeError names each difference (the workdir is then kept for the logs).
    Raises Unavailable (see `missing()`) where the machine cannot run a node."""
    reason = missing()
    if reason:
        raise Unavailable(reason)
    with host_lock():
        stale = clear_stale()
        if stale:
            print(f"removed what a node killed before its teardown left: {', '.join(stale)}", file=sys.stderr)
        workdir = workdir or Path(tempfile.mkdtemp(prefix="kubetrain-node-"))
        roots = [workdir, image_store()]
        before = hoststate.snapshot(roots)
        started: list[RealNode] = []
        try:
            node = start(workdir, started)
        except BaseException as exc:
            detail = started[0].describe_failure() if started else ""
            _finish(before, roots, workdir, started[0] if started else None, keep=True)
            if isinstance(exc, Exception):
                raise RuntimeError(f"the real node failed to start (logs in {workdir}): {exc}\n{detail}") from exc
            raise
        node.host_before = before
        try:
            yield node
        finally:
            _finish(before, roots, workdir, node)


def _finish(
    before: dict[str, Any], roots: list[Path], workdir: Path, node: RealNode | None, keep: bool = False
) -> None:
    """Tear down, undo what is left, check the host; the workdir goes unless `keep` (a failed
    start's logs) or the host check failed."""
    if node is not None:
        teardown(node)
    hoststate.undo(before, roots, bridge=BRIDGE)
    left = hoststate.differences(before, hoststate.snapshot(roots))
    if left:
        raise RuntimeError(f"the real node left the host changed (workdir kept: {workdir}):\n" + "\n".join(left))
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
