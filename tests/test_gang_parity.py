"""`kubetrain run --local` and the operator make the same gang decision.

operator/gang.py (processes) and operator/status.py (pods) are separate functions because
their inputs differ; this runs every case of the local table through both, so the two can
never drift apart silently.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kubetrain.api.models import TrainingJob
from kubetrain.local import gang
from kubetrain.operator.render import render_pod
from kubetrain.operator.status import PodView, decide, get_condition

UID = "job-uid"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
CASES = [
    # (exit codes, restarts so far, maxRestarts, seconds since start, activeDeadlineSeconds)
    ([None, None], 0, 3, 5.0, None),
    ([0, None], 0, 3, 5.0, None),
    ([0, 0], 0, 3, 5.0, None),
    ([0, 0], 3, 3, 99.0, 10),
    ([None, 1], 0, 3, 5.0, None),
    ([-9, 1], 2, 3, 5.0, None),
    ([0, 137], 2, 3, 5.0, None),
    ([None, 1], 3, 3, 5.0, None),
    ([None, 1], 0, 0, 5.0, None),
    ([None, None], 0, 3, 10.0, 10),
    ([None, 1], 0, 3, 11.0, 10),
    ([None, 1], 3, 3, 11.0, 10),
    ([None, None], 0, 3, 9.9, 10),
]


def job_and_pods(
    codes: list[int | None], restarts: int, max_restarts: int, deadline: int | None
) -> tuple[TrainingJob, list[PodView]]:
    run_policy: dict[str, Any] = {"maxRestarts": max_restarts}
    if deadline is not None:
        run_policy["activeDeadlineSeconds"] = deadline
    job = TrainingJob.model_validate(
        {
            "apiVersion": "kubetrain.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": UID, "generation": 1},
            "spec": {"nodes": len(codes), "runPolicy": run_policy},
            "status": {"attempt": restarts, "restarts": restarts, "startTime": T0.isoformat()},
        }
    )
    pods = []
    for rank, code in enumerate(codes):
        body = render_pod(job, "ns", UID, rank, restarts)
        body["metadata"]["uid"] = f"pod-{rank}"
        body["metadata"]["creationTimestamp"] = T0.strftime("%Y-%m-%dT%H:%M:%SZ")
        body["spec"]["nodeName"] = "node-a"
        if code is None:
            state: dict[str, Any] = {"running": {"startedAt": T0.strftime("%Y-%m-%dT%H:%M:%SZ")}}
            phase = "Running"
        else:
            state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}
            phase = "Succeeded" if code == 0 else "Failed"
        body["status"] = {"phase": phase, "containerStatuses": [{"name": "trainer", "ready": True, "state": state}]}
        pods.append(PodView.from_pod(body))
    return job, pods


def operator_verdict(codes: list[int | None], restarts: int, max_restarts: int, elapsed: float,
                     deadline: int | None) -> tuple[str, str]:  # fmt: skip
    job, pods = job_and_pods(codes, restarts, max_restarts, deadline)
    decision = decide(job, UID, pods, True, T0 + timedelta(seconds=elapsed))
    status = decision.status
    for kind, action in (("Succeeded", "succeed"), ("Failed", "fail")):
        condition = get_condition(status, kind)
        if condition is not None and condition.status == "True":
            return action, condition.reason
    if status.restarts == restarts + 1 and decision.delete_pods:
        return "restart", gang.REASON_NODE_FAILED
    assert not decision.delete_pods, "a waiting gang must not lose pods"
    return "wait", ""


@pytest.mark.parametrize(("codes", "restarts", "max_restarts", "elapsed", "deadline"), CASES)
def test_local_and_operator_agree(
    codes: list[int | None], restarts: int, max_restarts: int, elapsed: float, deadline: int | None
) -> None:
    local = gang.decide(codes, restarts=restarts, max_restarts=max_restarts, elapsed_s=elapsed,
                        active_deadline_s=deadline)  # fmt: skip
    assert operator_verdict(codes, restarts, max_restarts, elapsed, deadline) == (local.action, local.reason)
