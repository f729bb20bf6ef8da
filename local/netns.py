"""`kubetrain run --local --netns` (root): every node in its own network namespace.

A bridge in the root namespace and one veth pair per node give each node its own address in
a private /24, like pods on a cluster network. Each namespace gets an /etc/hosts (`ip netns
exec` mounts /etc/netns/<name>/hosts over /etc/hosts) that maps every pod's hostname and
DNS name to its address, as the headless Service does on a cluster: MASTER_ADDR keeps the
rendered name of node 0, and a script that silently assumes localhost fails here as it would
on a cluster. Everything is created on entry and removed on exit.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubetrain.operator.settings import RenderSettings

SUBNET_PREFIX = "10.231"
FIRST_HOST = 10
# The interface name inside each namespace; gloo/NCCL are pointed at it.
NODE_IFNAME = "eth0"
MAX_NETNS_NODES = 240
ETC_NETNS = Path("/etc/netns")


class NetnsError(RuntimeError):
    pass


@dataclass(frozen=True)
class NodeNamespace:
    name: str
    addr: str


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _used_subnets() -> set[str]:
    out = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line}


def _free_subnet() -> ipaddress.IPv4Network:
    used = [ipaddress.ip_network(s, strict=False) for s in _used_subnets() if s[0].isdigit()]
    for third in random.sample(range(256), 256):
        net = ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{third}.0/24")
        if not any(net.overlaps(other) for other in used):
            return net
    raise NetnsError(f"no free {SUBNET_PREFIX}.x.0/24 subnet")


def pod_hostnames(pod: dict[str, Any]) -> list[str]:
    """The names a pod answers to on a cluster: its FQDN under the headless Service, and its hostname."""
    spec, meta = pod["spec"], pod["metadata"]
    fqdn = f"{spec['hostname']}.{spec['subdomain']}.{meta['namespace']}.svc.{RenderSettings().cluster_domain}"
    return [fqdn, f"{spec['hostname']}.{spec['subdomain']}", spec["hostname"]]


def hosts_file(namespaces: Sequence[NodeNamespace], names: Sequence[Sequence[str]]) -> str:
    lines = ["127.0.0.1 localhost"]
    lines += [f"{ns.addr} {' '.join(hostnames)}" for ns, hostnames in zip(namespaces, names, strict=True)]
    return "\n".join(lines) + "\n"


@contextmanager
def node_namespaces(job: str, hostnames: Sequence[Sequence[str]]) -> Iterator[list[NodeNamespace]]:
    """One namespace per node; `hostnames[i]` are the names node i's address resolves from."""
    nodes = len(hostnames)
    if os.geteuid() != 0:
        raise NetnsError("needs root (it creates network namespaces, a bridge and veth pairs)")
    if shutil.which("ip") is None:
        raise NetnsError("needs iproute2's `ip`")
    if nodes > MAX_NETNS_NODES:
        raise NetnsError(f"at most {MAX_NETNS_NODES} nodes")
    tag = f"{random.getrandbits(16):04x}"
    bridge = f"kt{tag}br"
    net = _free_subnet()
    hosts = list(net.hosts())
    made: list[NodeNamespace] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{hosts[0]}/{net.prefixlen}", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for rank in range(nodes):
            ns = NodeNamespace(f"kubetrain-{job[:20]}-{tag}-{rank}", str(hosts[FIRST_HOST + rank - 1]))
            host_end, node_end = f"kt{tag}h{rank}", f"kt{tag}n{rank}"
            _ip("netns", "add", ns.name)
            made.append(ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
            _ip("link", "set", host_end, "master", bridge)
            _ip("link", "set", host_end, "up")
            _ip("link", "set", node_end, "netns", ns.name)
            _ip("-n", ns.name, "link", "set", node_end, "name", NODE_IFNAME)
            _ip("-n", ns.name, "addr", "add", f"{ns.addr}/{net.prefixlen}", "dev", NODE_IFNAME)
            _ip("-n", ns.name, "link", "set", NODE_IFNAME, "up")
            _ip("-n", ns.name, "link", "set", "lo", "up")
        etc_hosts = hosts_file(made, hostnames)
        for ns in made:
            (ETC_NETNS / ns.name).mkdir(parents=True, exist_ok=True)
            (ETC_NETNS / ns.name / "hosts").write_text(etc_hosts)
        yield made
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, check=False)
            shutil.rmtree(ETC_NETNS / ns.name, ignore_errors=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
