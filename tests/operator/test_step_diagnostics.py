"""A failed step of the end-to-end scenario says what a user needs, not just "timed out": the
same Diagnostics helper (tests/support/diagnostics.py), here on the session control plane
(the operator as a process, a stand-in kubelet serving rank 0's log), forced to fail by
waiting on a job that cannot succeed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from support.controlplane import ControlPlane
from support.diagnostics import Diagnostics, StepFailed
from support.jobs import valid_job
from support.kubelet import FakeKubelet, now
from support.kubelet_logs import KubeletLogs
from support.objects import Cluster
from support.operator_process import OperatorProcess

from kubetrain.api import naming

pytestmark = pytest.mark.cluster


def test_a_failed_step_prints_operator_log_pod_events_and_rank0_log(
    crds_installed: ControlPlane, operator: OperatorProcess, cluster: Cluster, kube_api: Any, tmp_path: Path
) -> None:
    namespace = cluster.namespace
    kubelet = FakeKubelet(kube_api, node_name="kubetrain-log-node")
    with KubeletLogs(kubelet, tmp_path) as logs:
        cluster.custom.create_namespaced_custom_object(
            naming.GROUP, naming.VERSION, namespace, naming.PLURAL, valid_job("stuck")
        )
        for pod in cluster.wait_pods("stuck", 2, attempt=0):
            kubelet.run(namespace, pod.metadata.name)
        logs.write("stuck-node-0", "rank 0 was here")
        # What a kubelet reports about a pod: the events section must hold it.
        pod = client.CoreV1Api(kube_api).read_namespaced_pod("stuck-node-1", namespace)
        client.CoreV1Api(kube_api).create_namespaced_event(
            namespace,
            {
                "metadata": {"generateName": "stuck-node-1."},
                "involvedObject": {
                    "kind": "Pod",
                    "name": "stuck-node-1",
                    "namespace": namespace,
                    "uid": pod.metadata.uid,
                },
                "reason": "BackOff",
                "message": "Back-off restarting failed container trainer",
                "type": "Warning",
                "lastTimestamp": now(),
            },
        )
        diagnose = Diagnostics(
            crds_installed.kubectl,
            namespace,
            operator_log=lambda lines: "\n".join(operator.log().splitlines()[-lines:]),
            extra=lambda: "node conditions: Ready",
        )
        with pytest.raises(StepFailed) as failed, diagnose.step("stuck Succeeded", job="stuck"):
            crds_installed.kubectl(
                "wait", "-n", namespace, "--for=condition=Succeeded", "trainingjob/stuck", "--timeout=2s"
            )
    message = str(failed.value)
    assert message.startswith("step failed: stuck Succeeded: ") and "timed out" in message.split("=====")[0], message
    operator_section = message.split("===== operator log (last 40 lines)\n", 1)[1].split("=====", 1)[0]
    assert "stuck" in operator_section, message
    events = message.split("===== events of trainingjob stuck and its pods\n", 1)[1].split("=====", 1)[0]
    assert "Warning BackOff Pod/stuck-node-1: Back-off restarting failed container trainer" in events, message
    assert "Normal Created TrainingJob/stuck: created headless Service and 2 pods" in events, message
    rank0 = message.split("===== rank 0's log (stuck-node-0, last 40 lines)\n", 1)[1].split("=====", 1)[0]
    assert rank0 == "rank 0 was here\n", message
    assert message.endswith("===== cluster provider\nnode conditions: Ready"), message[-500:]
