"""The real node's configuration as data (pure: paths and ports in, documents out): the
kubelet's KubeletConfiguration, containerd's config, the bridge CNI network and CoreDNS's
Corefile. tests/support/node.py writes them and starts the processes.

The network: one Linux bridge whose address is the node's InternalIP, the pods' gateway, the
cluster DNS server and the in-cluster apiserver relay at once. Pods get routes to the pod /16
and to the Service range only: no default route, so nothing in a pod reaches past the host.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BRIDGE = "kubetrain0"
POD_CIDR = "10.244.0.0/16"
NODE_IP = "10.244.0.1"
SERVICE_CIDR = "10.96.0.0/16"
# The `kubernetes` Service's ClusterIP (first of SERVICE_CIDR, in the apiserver cert's SANs).
KUBERNETES_SERVICE_IP = "10.96.0.1"
CLUSTER_DOMAIN = "cluster.local"
NETWORK_NAME = "kubetrain"


@dataclass(frozen=True)
class NodePaths:
    """Where one node's files live. `workdir` is per run; `store` (containerd's content and
    snapshots) persists under the cache dir so that an image is imported once, not per run."""

    workdir: Path
    store: Path

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "pod-logs"

    @property
    def cni_conf_dir(self) -> Path:
        return self.workdir / "cni" / "net.d"


def kubelet_config(
    paths: NodePaths, *, port: int, healthz_port: int, client_ca: Path, resolv_conf: Path
) -> dict[str, Any]:
    """KubeletConfiguration (kubelet.config.k8s.io/v1beta1) for this machine."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # The node IP, where the apiserver reaches it for logs and exec; nothing else listens.
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        # The apiserver authenticates with a client cert of `client_ca`; the kubelet asks the
        # apiserver (SubjectAccessReview) whether that user may read logs or exec.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        # This VM: cgroup v1 and no systemd managing cgroups; swap may be on.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDNS": [NODE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        # No nameserver: the host's resolvers never reach a pod (its DNS is CoreDNS alone).
        "resolvConf": str(resolv_conf),
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.workdir / "volume-plugins"),
        # The disk is shared with builds and caches: the defaults (imagefs.available < 15 %)
        # would evict pods and taint the node on a disk that is merely busy, and image GC
        # would delete the images the tests imported (nothing here can pull them back).
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # No KUBE-FIREWALL/KUBE-MARK-* chains: there is no kube-proxy to use them.
        "makeIPTablesUtilChains": False,
        "registerNode": True,
        "maxPods": 50,
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
    }


def containerd_config(paths: NodePaths, *, sandbox_image: str) -> dict[str, Any]:
    """containerd 1.6's config (version 2): every path under the node's own directories."""
    cri = "io.containerd.grpc.v1.cri"
    return {
        "version": 2,
        "root": str(paths.store),
        "state": str(paths.workdir / "containerd" / "state"),
        "grpc": {"address": str(paths.containerd_socket)},
        "ttrpc": {"address": str(paths.workdir / "containerd" / "ttrpc.sock")},
        "metrics": {"address": ""},
        "plugins": {
            "io.containerd.internal.v1.opt": {"path": str(paths.workdir / "containerd" / "opt")},
            cri: {
                "sandbox_image": sandbox_image,
                # This VM's bounding set lacks CAP_SYS_RESOURCE: without this every sandbox
                # fails ("can't get final child's PID from pipe") on oom_score_adj.
                "restrict_oom_score_adj": True,
                "enable_selinux": False,
                "containerd": {
                    "snapshotter": "overlayfs",
                    "default_runtime_name": "runc",
                    "runtimes": {
                        "runc": {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {"SystemdCgroup": False, "Root": str(paths.workdir / "runc")},
                        }
                    },
                },
                "cni": {"bin_dir": "/usr/lib/cni", "conf_dir": str(paths.cni_conf_dir), "max_conf_num": 1},
                # No registry is reachable: images come from `ctr images import` only.
                "registry": {"config_path": ""},
            },
        },
    }


def cni_network(paths: NodePaths) -> dict[str, Any]:
    """The bridge network (conflist). ipMasq off and no default route: pods talk to the pod
    network and, through the relay on the gateway, to the apiserver."""
    return {
        "cniVersion": "0.4.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    # Allocations under the node's dir, not /var/lib/cni/networks.
                    "dataDir": str(paths.workdir / "cni" / "ipam"),
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    "routes": [{"dst": SERVICE_CIDR}],
                },
            }
        ],
    }


def corefile(*, kubeconfig: Path, context: str, ready_port: int, health_port: int) -> str:
    """CoreDNS on the node IP serving cluster.local from the API (pods' <pod>.<svc>.<ns> names);
    no `forward`: any other name fails, nothing leaves the host."""
    return f""".:53 {{
    bind {NODE_IP}
    errors
    log
    ready 127.0.0.1:{ready_port}
    health 127.0.0.1:{health_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig} {context}
    }}
    cache 5
}}
"""


def toml(document: Mapping[str, Any]) -> str:
    """TOML for containerd (no TOML writer is a dependency): scalars first, then one
    [dotted.table] per nested mapping. Strings as JSON strings, which TOML reads alike."""

    def table(prefix: str, values: Mapping[str, Any]) -> list[str]:
        lines = [f"[{prefix}]"] if prefix else []
        nested = {k: v for k, v in values.items() if isinstance(v, Mapping)}
        for key, value in values.items():
            if key not in nested:
                lines.append(f"{json.dumps(key)} = {json.dumps(value)}")
        for key, value in nested.items():
            lines += table(f"{prefix}.{json.dumps(key)}" if prefix else json.dumps(key), value)
        return lines

    return "\n".join(table("", document)) + "\n"
