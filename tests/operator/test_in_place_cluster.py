"""The in-place gang restart through the operator, on the real control plane: the real trainer
under torchrun on the process node, which runs the pods' readiness probes, projects their
attempt label (the downward API) and serves their logs (`pods/log`) as a kubelet does. A
crashed worker restarts the gang inside the same pods; a FailJob rule still fails the job at
once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.controlplane import ControlPlane, free_port
from support.objects import Cluster, condition, has_condition
from support.operator_process import OperatorProcess
from support.processnode import ProcessNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRAINING = {"dataset": "digits", "epochs": 3, "batchSize": 32, "logEverySteps": 5}
CHECKPOINT = {"dir": "/checkpoints", "everySteps": 20, "volume": {"persistentVolumeClaim": {"claimName": "ck"}}}


def create(cluster: Cluster, name: str, fault: str, **run_policy: Any) -> None:
    cluster.create_job(
        name,
        nodes=2,
        masterPort=free_port(),  # every pod shares the node's loopback
        env=[{"name": "KUBETRAIN_FAULT", "value": fault}],
        training=TRAINING,
        checkpoint=CHECKPOINT,
        runPolicy={"maxRestarts": 2, **run_policy},
    )


def records(node: ProcessNode, namespace: str) -> list[dict[str, Any]]:
    metrics = node.workdir / "pvc" / namespace / "ck" / "metrics.jsonl"
    text = metrics.read_text() if metrics.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("refresh", [True, False], ids=["kubelet-refreshes-the-file", "file-never-refreshed"])
def test_a_crashed_worker_restarts_the_gang_in_its_pods(
    crds_installed: ControlPlane, cluster: Cluster, operator: OperatorProcess, tmp_path: Path, refresh: bool
) -> None:
    """`file-never-refreshed`: a kubelet that never projects the new attempt label into the pods'
    files (seen in CI: none did for 60 s). The operator's order to the agents' port moves the
    gang anyway: the same pods restart in place, with no InPlaceRestartTimedOut."""
    ns = cluster.namespace
    workdir = tmp_path / "node"
    node = ProcessNode(crds_installed.api_client, namespaces=[ns], workdir=workdir, refresh_downward_api=refresh)
    with node:
        create(cluster, "inplace", "kill,rank=1,step=30")
        first = {p.metadata.name: p.metadata.uid for p in cluster.wait_pods("inplace", 2, attempt=0, timeout=60)}
        job = cluster.wait_job("inplace", has_condition("Succeeded"), "Succeeded after an in-place restart", 300)
        status = job["status"]
        assert (status["attempt"], status["restarts"]) == (1, 1), status
        (failure,) = status["failures"]
        assert (failure["rank"], failure["exitCode"], failure["pod"]) == (1, 137, "inplace-node-1"), failure
        line = status["timeline"]
        assert (line["attempt"], line["start"]) == (1, "InPlace") and "podsCreatedAt" not in line, line
        assert line["firstStepAt"] > line["failedAt"] and line["phases"].endswith("s"), line
        # The same pods (uids) ran both attempts and were relabelled, never recreated.
        last = {p.metadata.name: p.metadata.uid for p in cluster.core.list_namespaced_pod(ns).items}
        assert last == first
        labels = {p.metadata.labels["kubetrain.dev/attempt"] for p in cluster.core.list_namespaced_pod(ns).items}
        assert labels == {"1"}
        resumed = [r for r in records(node, ns) if r["event"] == "resume"]
        # Node 0's worker, the survivor, saved step 30 when its peer died: no step lost.
        assert [(r["step"], r["attempt"]) for r in resumed] == [(30, 1)]
        restart = [e for e in cluster.events("inplace") if e.reason == "GangRestart"]
        assert len(restart) == 1 and "in place as attempt 1" in restart[0].message
        files = sorted(workdir.glob("pods/*/*/volumes/kubetrain-pod/attempt"))
        assert len(files) == 2 and {f.read_text() for f in files} == ({"1"} if refresh else {"0"}), files
        assert node.errors == []


def test_a_fail_job_rule_fails_a_gang_held_in_place_at_once(
    crds_installed: ControlPlane, cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = cluster.namespace
    rule = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}
    node = ProcessNode(crds_installed.api_client, namespaces=[ns], workdir=tmp_path / "node")
    with node:
        create(cluster, "failjob", "exit,rank=1,step=10,code=3", failurePolicy={"rules": [rule]})
        job = cluster.wait_job("failjob", has_condition("Failed"), "Failed by the rule", 240)
        failed = condition(job, "Failed")
        assert failed is not None and failed["reason"] == "FailurePolicy", failed
        assert "exit code 3" in failed["message"] and "failurePolicy.rules[0]" in failed["message"]
        assert (job["status"]["attempt"], job["status"]["restarts"]) == (0, 0)
        assert node.errors == []
