"""A trainer that crashes at teardown, after rank 0 recorded `done` and its final checkpoint,
on the real control plane with real `pods/log`: the operator reads rank 0's log before acting
on the failure, so the late-crash rule finishes the job instead of rerunning the whole gang.

The operator reads progress only every 600 s here, so the `done` record reaches it through
that read before the restart and through nothing else."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.kubelet import FakeKubelet
from support.kubelet_logs import KubeletLogs
from support.objects import Cluster, condition, has_condition
from support.operator_process import OperatorProcess
from support.waiting import wait_for

pytestmark = pytest.mark.cluster


def record(event: str, step: int, **fields: Any) -> str:
    return json.dumps({"event": event, "time": time.time(), "step": step, "epoch": 1, "total_steps": 100, **fields})


def test_a_crash_at_teardown_after_done_does_not_rerun_the_job(
    cluster: Cluster, start_operator: Callable[..., OperatorProcess], kube_api: Any, tmp_path: Path
) -> None:
    start_operator(progress_interval=600)  # reads rank 0's log at most every 600 s on its own
    node = FakeKubelet(kube_api, node_name="kubetrain-log-node")
    with KubeletLogs(node, tmp_path) as logs:
        cluster.create_job("late", nodes=2, runPolicy={"maxRestarts": 2})
        logs.write("late-node-0", record("step", 90, loss=0.1))
        for pod in cluster.wait_pods("late", 2, attempt=0):
            node.run(cluster.namespace, pod.metadata.name)
        job = cluster.wait_job("late", lambda j: (j.get("status") or {}).get("progress"), "the first progress read")
        assert job["status"]["progress"]["step"] == 90

        logs.write("late-node-0", record("checkpoint", 100, path="/ckpt/step-100"))
        logs.write("late-node-0", record("done", 100, loss=0.05))
        node.succeed(cluster.namespace, "late-node-0")
        node.fail(cluster.namespace, "late-node-1", exit_code=134)  # SIGABRT at teardown

        job = cluster.wait_job("late", has_condition("Succeeded"), "Succeeded")
    succeeded = condition(job, "Succeeded")
    assert succeeded is not None and succeeded["reason"] == "CompletedBeforeFailure", succeeded
    assert "rank 0 recorded done at step 100" in succeeded["message"] and "exit code 134" in succeeded["message"]
    status = job["status"]
    assert (status["attempt"], status["restarts"], status.get("failures")) == (0, 0, None)
    assert status["lastCheckpoint"]["step"] == 100 and status["progress"]["doneAt"]
    assert "GangRestart" not in [e.reason for e in cluster.events("late")]


def test_a_rank_still_running_after_done_is_deleted_and_the_job_succeeds(
    cluster: Cluster, start_operator: Callable[..., OperatorProcess], kube_api: Any, tmp_path: Path
) -> None:
    start_operator(straggler_timeout=3)  # stops ranks that still run 3 s after rank 0's done
    node = FakeKubelet(kube_api, node_name="kubetrain-log-node")
    with KubeletLogs(node, tmp_path) as logs:
        cluster.create_job("strag", nodes=2, runPolicy={"maxRestarts": 2, "cleanPodPolicy": "None"})
        for pod in cluster.wait_pods("strag", 2, attempt=0):
            node.run(cluster.namespace, pod.metadata.name)
        logs.write("strag-node-0", record("checkpoint", 100, path="/ckpt/step-100"))
        logs.write("strag-node-0", record("done", 100, loss=0.05))
        node.succeed(cluster.namespace, "strag-node-0")
        # strag-node-1 never ends: its trainer hangs in teardown.
        job = cluster.wait_job("strag", has_condition("Succeeded"), "Succeeded")
        # Deleted although cleanPodPolicy is None (no kubelet here confirms the deletion: it terminates).
        wait_for(lambda: [p.metadata.name for p in cluster.live_pods("strag")] == ["strag-node-0"], 30, "deleted")
    succeeded = condition(job, "Succeeded")
    assert succeeded is not None and succeeded["reason"] == "CompletedWithStragglers", succeeded
    assert "node 1 (pod strag-node-1) still running 3 s after done; its pod deleted" in succeeded["message"]
    status = job["status"]
    assert (status["attempt"], status["restarts"], status.get("failures")) == (0, 0, None)
    straggler = cluster.wait_events("strag", "Straggler")
    assert len(straggler) == 1 and straggler[0].type == "Warning" and "strag-node-1" in straggler[0].message
