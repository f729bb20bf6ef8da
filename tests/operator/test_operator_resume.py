"""The whole loop on one machine: the operator's gang runs the real trainer (torchrun, gloo) on
the process node; a pod deleted mid-training restarts the whole gang, which resumes from the
checkpoint on the shared volume and succeeds."""

from __future__ import annotations

import json

import pytest
from support.controlplane import free_port
from support.objects import Cluster, has_condition
from support.operator_process import OperatorProcess
from support.processnode import ProcessNode
from support.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_deleted_pod_restarts_the_gang_which_resumes_from_its_checkpoint(
    cluster: Cluster, operator: OperatorProcess, process_node: ProcessNode
) -> None:
    ns = cluster.namespace
    cluster.create_job(
        "resume",
        nodes=2,
        masterPort=free_port(),  # every pod shares the node's loopback
        training={
            "dataset": "synthetic",
            "syntheticSamples": 100_000,
            "epochs": 1,
            "maxSteps": 600,
            "batchSize": 32,
            "logEverySteps": 50,
        },
        checkpoint={
            "dir": "/checkpoints",
            "everySteps": 50,
            "volume": {"persistentVolumeClaim": {"claimName": "ck"}},
        },
        runPolicy={"maxRestarts": 2},
    )
    metrics = process_node.workdir / "pvc" / ns / "ck" / "metrics.jsonl"

    def records() -> list[dict[str, object]]:
        text = metrics.read_text() if metrics.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    wait_for(lambda: any(r["event"] == "checkpoint" for r in records()), 180, "a first checkpoint")
    cluster.core.delete_namespaced_pod("resume-node-1", ns)

    job = cluster.wait_job("resume", has_condition("Succeeded"), "Succeeded after the gang restart", 600)
    status = job["status"]
    # A deleted pod is a disruption: not counted against maxRestarts.
    assert (status["restarts"], status["uncountedRestarts"], status["attempt"]) == (0, 1, 1), status
    (failure,) = status["failures"]
    assert (failure["rank"], failure["reason"]) == (1, "PodDeleted")
    events = [r["event"] for r in records()]
    # Both ranks stopped at one step on the SIGTERM and rank 0 saved it: the resume loses none.
    (saved,) = [r for r in records() if r["event"] == "checkpoint" and r.get("reason") == "signal"]
    (resumed,) = [r for r in records() if r["event"] == "resume"]
    trained = max(int(str(r["step"])) for r in records()[: records().index(resumed)] if r["event"] == "step")
    assert saved["step"] == resumed["step"] and int(str(saved["step"])) >= trained, events
    # The process node serves its pods' logs (pods/log): the operator folded rank 0's records.
    assert resumed["reason"] == "signal" and status["lastCheckpoint"]["step"] == 600
    assert events[-1] == "done"
