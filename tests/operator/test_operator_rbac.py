"""The operator in its default deployment mode (cluster-wide, the chart's ClusterRole) running
as the chart's ServiceAccount with a real token: a whole job lifecycle, and not one refusal in
its log, leader election included (the chart's Role on Leases in its own namespace).
(tests/deploy/test_chart_cluster.py covers namespaced mode with the chart's Roles.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.controlplane import ControlPlane
from support.kubelet import FakeKubelet
from support.objects import Cluster, has_condition
from support.operator_process import running_operator
from support.tools import chart_identity
from support.waiting import wait_for

pytestmark = pytest.mark.cluster


def test_cluster_mode_as_the_charts_service_account(
    crds_installed: ControlPlane, cluster: Cluster, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    kubeconfig = chart_identity(crds_installed, cluster.namespace, tmp_path / "sa.kubeconfig")

    log = tmp_path / "operator.log"
    lease = {"leader_elect_resource_name": "rbac-kubetrain", "leader_elect_resource_namespace": cluster.namespace}
    flags = {"log_level": "debug", "leader_elect": True, **lease}
    with running_operator(kubeconfig, log, **flags) as proc:
        wait_for(proc.leading, 30, "the operator to take the leader Lease")
        cluster.create_job("rbac", nodes=2, runPolicy={"maxRestarts": 1, "ttlSecondsAfterFinished": 0})
        for pod in cluster.wait_pods("rbac", 2, attempt=0):
            kubelet.run(cluster.namespace, pod.metadata.name)
        cluster.wait_job("rbac", has_condition("Running"), "Running")
        kubelet.fail(cluster.namespace, "rbac-node-1", exit_code=1)
        cluster.wait_job("rbac", lambda j: (j.get("status") or {}).get("restarts") == 1, "a gang restart")
        for pod in cluster.wait_pods("rbac", 2, attempt=1):
            kubelet.run(cluster.namespace, pod.metadata.name)
        cluster.wait_job("rbac", has_condition("Running"), "Running again")
        wait_for(lambda: "reading the log of" in proc.log(), 30, "a progress read of rank 0's log (pods/log)")
        for rank in range(2):
            kubelet.succeed(cluster.namespace, f"rbac-node-{rank}")
        wait_for(lambda: cluster.job("rbac") is None, 30, "the TTL deleting the finished job")
        assert [e.reason for e in cluster.events("rbac")][:1] == ["Created"]
