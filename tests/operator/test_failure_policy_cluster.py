"""The failure policy and hang detection against the real control plane: `kubetrain operator`
as a subprocess, pods moved by the FakeKubelet. Every wait has a deadline; nothing sleeps."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
from support.kubelet import FakeKubelet
from support.kubelet_logs import KubeletLogs
from support.objects import Cluster, condition, has_condition
from support.operator_process import OperatorProcess
from support.waiting import wait_for

pytestmark = pytest.mark.cluster

# tests/support/operator_process.py starts the operator with --progress-interval=2.
PROGRESS_INTERVAL = 2


def time_of(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def status(job: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = job.get("status") or {}
    return result


def test_an_evicted_pod_restarts_the_gang_without_using_the_budget(
    cluster: Cluster, operator: OperatorProcess, kubelet: FakeKubelet
) -> None:
    ns = cluster.namespace
    cluster.create_job("evict", nodes=2, runPolicy={"maxRestarts": 0})
    cluster.run_all(kubelet, "evict", 0, 2)
    cluster.wait_job("evict", has_condition("Running"), "Running")

    # What a kubelet under memory pressure writes (Kubernetes >= 1.26 adds the condition).
    pressure = "The node was low on resource: memory."
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": pressure}
    kubelet.patch_status(
        ns, "evict-node-1", {"phase": "Failed", "reason": "Evicted", "message": pressure, "conditions": [disruption]}
    )
    job = cluster.wait_job("evict", lambda j: status(j).get("attempt") == 1, "attempt 1 after the eviction")
    assert (status(job)["restarts"], status(job)["uncountedRestarts"]) == (0, 1)
    (failure,) = status(job)["failures"]
    assert (failure["rank"], failure["reason"]) == (1, "Evicted")

    # maxRestarts 0, yet the gang runs again: the disruption used none of the budget.
    cluster.run_all(kubelet, "evict", 1, 2)
    job = cluster.wait_job("evict", has_condition("Running"), "Running as attempt 1")
    assert status(job)["phase"] == "Running" and status(job)["restarts"] == 0
    (restart,) = [e for e in cluster.events("evict") if e.reason == "GangRestart"]
    assert restart.message.endswith(
        "(not counted against maxRestarts; the default failure policy "
        "(RestartJobAndIgnoreMaxRestarts on pod condition DisruptionTarget))"
    )


def test_a_fail_job_rule_fails_at_once_naming_the_rule(
    cluster: Cluster, operator: OperatorProcess, kubelet: FakeKubelet
) -> None:
    rules = [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}}]
    cluster.create_job("badconf", nodes=2, runPolicy={"maxRestarts": 3, "failurePolicy": {"rules": rules}})
    cluster.run_all(kubelet, "badconf", 0, 2)
    cluster.wait_job("badconf", has_condition("Running"), "Running")

    kubelet.fail(cluster.namespace, "badconf-node-0", exit_code=2)
    job = cluster.wait_job("badconf", has_condition("Failed", reason="FailurePolicy"), "Failed by the policy")
    failed = condition(job, "Failed")
    assert failed is not None and "exit code 2" in failed["message"]
    assert failed["message"].endswith("failed by failurePolicy.rules[0] (FailJob on exit code 2)")
    assert (status(job)["attempt"], status(job)["restarts"]) == (0, 0)
    assert [f["exitCode"] for f in status(job)["failures"]] == [2]
    assert "GangRestart" not in [e.reason for e in cluster.events("badconf")]
    assert not cluster.live_pods("badconf", attempt=1)


def test_a_gang_without_progress_goes_stalled_and_restarts(
    cluster: Cluster, operator: OperatorProcess, kubelet: FakeKubelet
) -> None:
    """No kubelet serves logs here, so rank 0 never reports progress: its start-up stalls,
    counted from when the attempt started running."""
    hang = 3
    cluster.create_job("hung", nodes=2, runPolicy={"hangTimeoutSeconds": 60, "startupTimeoutSeconds": hang})
    cluster.run_all(kubelet, "hung", 0, 2)
    running = condition(cluster.wait_job("hung", has_condition("Running"), "Running"), "Running")
    assert running is not None

    job = cluster.wait_job("hung", has_condition("Stalled"), "Stalled", timeout=hang + 30)
    stalled = condition(job, "Stalled")
    assert stalled is not None and stalled["reason"] == "NoProgress"
    assert f"wrote no record within startupTimeoutSeconds={hang} of attempt 0" in stalled["message"]
    (failure,) = status(job)["failures"]
    assert (failure["reason"], failure["rank"], status(job)["restarts"], status(job)["attempt"]) == ("Stalled", 0, 1, 1)
    # On time: the operator requeues for the moment the timeout passes (times have 1 s resolution).
    late = (time_of(failure["time"]) - time_of(running["lastTransitionTime"])).total_seconds()
    assert hang <= late <= hang + PROGRESS_INTERVAL + 1
    # Events are posted after the status write that carries them.
    wait_for(
        lambda: {"Stalled", "GangRestart"} <= {e.reason for e in cluster.events("hung")},
        10,
        "the Stalled and GangRestart Events",
    )
    cluster.wait_pods("hung", 2, attempt=1)


class Rank0:
    """A stand-in for rank 0's trainer: a step record on its log twice a second until stopped."""

    def __init__(self, logs: KubeletLogs, pod: str) -> None:
        self.logs, self.pod = logs, pod
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._train, name=f"rank0-{pod}", daemon=True)
        self.stopped_at = 0.0

    def _train(self) -> None:
        step = 0
        while not self.stop.wait(0.5):
            step += 1
            record = {"event": "step", "time": time.time(), "step": step, "epoch": 0, "total_steps": 1000}
            self.logs.write(self.pod, json.dumps(record))

    def __enter__(self) -> Rank0:
        self.thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop.set()
        self.thread.join(5)
        self.stopped_at = time.time()


def test_rank_zero_that_stops_logging_goes_stalled_and_restarts(
    cluster: Cluster, operator: OperatorProcess, kubelet: FakeKubelet, kube_api: Any, tmp_path: Path
) -> None:
    """`kubelet` (the fixture) finishes deletions; `node` binds the pods to a node whose kubelet
    endpoint serves rank 0's log, as a real one would."""
    hang = 8
    node = FakeKubelet(kube_api, node_name="kubetrain-log-node")
    with KubeletLogs(node, tmp_path) as logs:
        cluster.create_job("quiet", nodes=2, runPolicy={"hangTimeoutSeconds": hang})
        with Rank0(logs, "quiet-node-0") as rank0:
            for pod in cluster.wait_pods("quiet", 2, attempt=0):
                node.run(cluster.namespace, pod.metadata.name)
            # Logging for well over the timeout (two records a second): no stall.
            steps = 2 * (hang + 2 * PROGRESS_INTERVAL)

            def logged(job: dict[str, Any]) -> bool:
                return int((status(job).get("progress") or {}).get("step", 0)) >= steps

            job = cluster.wait_job("quiet", logged, f"progress past step {steps}", timeout=60)
            assert status(job)["attempt"] == 0 and condition(job, "Stalled") is None

        job = cluster.wait_job("quiet", has_condition("Stalled"), "Stalled", timeout=hang + 30)
        (failure,) = status(job)["failures"]
        progress = status(job)["progress"]
        # No rank's stacks in these logs: rank 0 reported the stall, but no rank is blamed for it.
        assert (failure["reason"], failure.get("rank"), status(job)["restarts"]) == ("Stalled", None, 1)
        assert f"last progress: step {progress['step']} at {progress['updatedAt']}" in failure["message"]
        assert "culprit unknown: no rank wrote its stacks" in failure["message"]
        stalled_at = time_of(failure["time"])
        assert (stalled_at - time_of(progress["updatedAt"])).total_seconds() >= hang
        assert stalled_at.timestamp() <= rank0.stopped_at + hang + PROGRESS_INTERVAL + 1

        # The next attempt logs again from its checkpoint: Stalled clears, nothing restarts.
        pods = cluster.wait_pods("quiet", 2, attempt=1)
        logs.clear("quiet-node-0")
        with Rank0(logs, "quiet-node-0"):
            for pod in pods:
                node.run(cluster.namespace, pod.metadata.name)
            job = cluster.wait_job(
                "quiet", has_condition("Stalled", "False", reason="ProgressResumed"), "progress resumed", timeout=30
            )
        assert status(job)["attempt"] == 1 and status(job)["restarts"] == 1
