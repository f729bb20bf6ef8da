"""Refused pods on the real control plane: what the API server's own admission refuses for a
while (a ServiceAccount or PriorityClass created after the job, a ResourceQuota too small)
blocks the job with condition PodCreationBlocked and one Warning Event, and the job recovers
by itself once the object appears; a pod the API server rejects as invalid fails the job at
once with PodCreationFailed. The kubelet is FakeKubelet."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from support.kubelet import FakeKubelet
from support.objects import Cluster, condition, has_condition
from support.operator_process import OperatorProcess
from support.waiting import wait_for

from kubetrain.operator.refusal import BLOCKED, FAILED

pytestmark = pytest.mark.cluster
NAME = "refused"
# Retries back off up to 60 s; a fix is seen within the backoff reached by then (a few s).
RECOVERY_TIMEOUT = 75


def quota(cluster: Cluster, pods: int) -> None:
    """A ResourceQuota of `pods` pods, once the quota controller has computed its usage
    (before that the API server refuses every pod with "status unknown for quota")."""
    body = {"metadata": {"name": "pods"}, "spec": {"hard": {"pods": str(pods)}}}
    try:
        cluster.core.create_namespaced_resource_quota(cluster.namespace, body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        cluster.core.patch_namespaced_resource_quota("pods", cluster.namespace, body)

    def computed() -> bool:
        status = cluster.core.read_namespaced_resource_quota("pods", cluster.namespace).status
        return status is not None and (status.hard or {}).get("pods") == str(pods) and status.used is not None

    wait_for(computed, 30, f"the quota controller computing a quota of {pods} pods")


def service_account(cluster: Cluster) -> None:
    cluster.core.create_namespaced_service_account(cluster.namespace, {"metadata": {"name": "trainer"}})


def priority_class(name: str) -> Callable[[Cluster], None]:
    def create(cluster: Cluster) -> None:
        scheduling = client.SchedulingV1Api(cluster.core.api_client)
        scheduling.create_priority_class({"metadata": {"name": name}, "value": 1000})

    return create


@dataclass
class Case:
    spec: dict[str, Any]
    reason: str  # of PodCreationBlocked, or PodCreationFailed: the job fails at once
    names: str  # what the condition's message must name
    fix: Callable[[Cluster], None] | None = None
    before: Callable[[Cluster], None] | None = None
    pods_while_blocked: int = 0


PRIORITY_CLASS = f"kubetrain-test-{uuid.uuid4().hex[:8]}"
CASES = {
    "service-account-created-later": Case(
        {"serviceAccountName": "trainer"},
        "ServiceAccountNotFound",
        'ServiceAccount "trainer" does not exist',
        fix=service_account,
    ),
    "priority-class-created-later": Case(
        {"priorityClassName": PRIORITY_CLASS},
        "PriorityClassNotFound",
        f'PriorityClass "{PRIORITY_CLASS}" does not exist',
        fix=priority_class(PRIORITY_CLASS),
    ),
    "quota-raised": Case(
        {},
        "QuotaExceeded",
        'ResourceQuota "pods" is used up',
        before=lambda cluster: quota(cluster, 1),
        fix=lambda cluster: quota(cluster, 2),
        pods_while_blocked=1,  # the quota admits rank 0; the gang waits for rank 1
    ),
    # Valid for the TrainingJob schema (any string), invalid for a pod (a label name).
    "invalid-pod": Case({"tolerations": [{"key": "not a key!", "operator": "Exists"}]}, FAILED, "tolerations[0].key"),
}


@pytest.fixture
def no_priority_class(kube_api: Any) -> Any:
    """The cluster-scoped PriorityClass a case creates goes after the test."""
    yield
    try:
        client.SchedulingV1Api(kube_api).delete_priority_class(PRIORITY_CLASS)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_refused_pods(
    case: Case, cluster: Cluster, operator: OperatorProcess, kubelet: FakeKubelet, no_priority_class: Any
) -> None:
    if case.before is not None:
        case.before(cluster)
    cluster.create_job(NAME, nodes=2, **case.spec)
    if case.fix is None:
        job = cluster.wait_job(NAME, has_condition("Failed", reason=FAILED), FAILED, timeout=30)
        assert case.names in condition(job, "Failed")["message"]  # type: ignore[index]
        assert condition(job, BLOCKED) is None and job["status"]["phase"] == "Failed"
        # The Event is posted after the status write the wait saw.
        reasons = wait_for(lambda: [e.reason for e in cluster.events(NAME)], 10, f"the {FAILED} event")
        assert reasons == [FAILED]
        return

    job = cluster.wait_job(NAME, has_condition(BLOCKED, reason=case.reason), f"{BLOCKED} ({case.reason})")
    assert case.names in condition(job, BLOCKED)["message"]  # type: ignore[index]
    assert job["status"]["phase"] == "Pending" and not condition(job, "Created") and not condition(job, "Failed")
    assert len(cluster.live_pods(NAME)) == case.pods_while_blocked

    def blocked_events() -> list[Any]:
        return [e for e in cluster.events(NAME) if e.reason == BLOCKED]

    (event,) = wait_for(blocked_events, 10, "the PodCreationBlocked event")
    assert event.type == "Warning" and case.names in event.message

    case.fix(cluster)
    for pod in cluster.wait_pods(NAME, 2, timeout=RECOVERY_TIMEOUT):
        kubelet.run(cluster.namespace, pod.metadata.name)
    job = cluster.wait_job(NAME, has_condition("Running"), "Running once unblocked")
    assert condition(job, BLOCKED)["status"] == "False"  # type: ignore[index]
    assert job["status"]["attempt"] == 0 and job["status"]["restarts"] == 0
    # One event for the block, not one per retry.
    assert len(blocked_events()) == 1
