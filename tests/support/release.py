"""The chart installed the way a user installs it, on a cluster from support.providers: the
end-to-end scenario and benchmarks/teardown_stress_pods.py share it.

The CPU knob: digits-cpu asks `cpu: "1"` per node and a one-node cluster of 2 CPUs cannot also
fit the operator's 100m, so the operator is installed with `resources.requests.cpu=0`
(README, "End to end").
"""

from __future__ import annotations

from support.providers import Provider
from support.tools import ROOT

RELEASE = OPERATOR_NAMESPACE = "kubetrain"
TRAINER_IMAGE = "kubetrain/trainer:0.1.0-cpu"
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


def install_operator(cluster: Provider, *, progress_interval_s: float = 5) -> None:
    """helm upgrade --install from charts/kubetrain with the images already in the cluster, then
    wait until the operator pod is Ready."""
    cluster.helm(
        "upgrade", "--install", RELEASE, str(ROOT / "charts" / "kubetrain"),
        "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
        "--set", f"fullnameOverride={RELEASE}",
        "--set", "image.pullPolicy=Never",
        "--set", f"operator.trainerImage={TRAINER_IMAGE}",
        "--set", f"operator.progressIntervalSeconds={progress_interval_s:g}",
        "--set", "resources.requests.cpu=0",  # the CPU knob (module docstring)
        "--wait", "--timeout", "10m",
        timeout=660,
    )  # fmt: skip
    cluster.kubectl(
        "wait", "-n", OPERATOR_NAMESPACE, "pod", "-l", OPERATOR_SELECTOR,
        "--for=condition=Ready", "--timeout=300s", timeout=320,
    )  # fmt: skip
