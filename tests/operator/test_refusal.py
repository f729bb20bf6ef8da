"""refusal.py: which refusals of the API server are retried (PodCreationBlocked) and which
fail the job (PodCreationFailed), and the status and events each leads to. The messages are
the API server's own wording (tests/operator/test_refusals_cluster.py sees them for real)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from support.decisions import cond
from support.jobs import valid_job
from support.pods import JOB_UID, T0, pod_view

from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.operator.conditions import get_condition
from kubetrain.operator.decision import Decision
from kubetrain.operator.refusal import BLOCKED, FAILED, classify, settle
from kubetrain.operator.status import decide

pytestmark = pytest.mark.unit

T1 = T0 + timedelta(seconds=5)
SA = 'pods "j-node-0" is forbidden: error looking up service account ns/trainer: serviceaccount "trainer" not found'
QUOTA = 'pods "j-node-1" is forbidden: exceeded quota: compute, requested: cpu=2, used: cpu=2, limited: cpu=3'
INVALID = 'Pod "j-node-0" is invalid: spec.containers[0].ports[0].name: Invalid value: "a-port-name-too-long"'


@pytest.mark.parametrize(
    ("status", "message", "transient", "reason", "names"),
    [
        (403, SA, True, "ServiceAccountNotFound", 'ServiceAccount "trainer" does not exist'),
        (403, QUOTA, True, "QuotaExceeded", 'ResourceQuota "compute" is used up'),
        (
            403,
            'pods "j-node-0" is forbidden: status unknown for quota: compute, resources: cpu',
            True,
            "QuotaNotReady",
            'ResourceQuota "compute" has no usage computed yet',
        ),
        (
            403,
            'pods "j-node-0" is forbidden: no PriorityClass with name urgent was found',
            True,
            "PriorityClassNotFound",
            'PriorityClass "urgent" does not exist',
        ),
        (
            403,
            'pods "j-node-0" is forbidden: unable to create new content in namespace ns because it is being terminated',
            True,
            "NamespaceTerminating",
            "the namespace is being deleted",
        ),
        (
            403,
            'pods is forbidden: User "system:serviceaccount:kubetrain-system:kubetrain" cannot create '
            'resource "pods" in API group "" in the namespace "ns"',
            True,
            "OperatorForbidden",
            "the operator (system:serviceaccount:kubetrain-system:kubetrain) may not create it",
        ),
        (422, INVALID, False, FAILED, "the API server refused a pod"),
        (
            403,
            'pods "j-node-0" is forbidden: violates PodSecurity "restricted:latest": privileged',
            False,
            FAILED,
            "the API server refused a pod",
        ),
        (
            403,
            'admission webhook "policy.example.com" denied the request: GPUs need a team label',
            False,
            FAILED,
            "the API server refused a pod",
        ),
        # A quota that needs a field the pods do not set refuses them again, whatever frees up.
        (403, 'pods "j-node-0" is forbidden: failed quota: compute: must specify limits.cpu', False, FAILED, ""),
    ],
)
def test_classify(status: int, message: str, transient: bool, reason: str, names: str) -> None:
    refusal = classify(status, message)
    assert (refusal.transient, refusal.reason) == (transient, reason)
    assert refusal.message.startswith(names) and refusal.message.endswith(message)  # the server's own words


def make_job(status: dict[str, Any] | None = None, **run_policy: Any) -> TrainingJob:
    doc = valid_job("j", runPolicy={"maxRestarts": 3, **run_policy})
    doc["metadata"].update(namespace="ns", uid=JOB_UID, generation=1)
    if status is not None:
        doc["status"] = status
    return TrainingJob.model_validate(doc)


def written(status: TrainingJobStatus) -> TrainingJob:
    """The job as the API server holds it once `status` was written."""
    return make_job(status.wire())


def fresh() -> tuple[TrainingJobStatus, Decision]:
    """A new job's first pass: it wants the Service and both pods, and counts them as created."""
    job = make_job()
    return TrainingJobStatus(), decide(job, JOB_UID, [], False, T0)


def test_admitted_without_a_refusal_writes_the_decision_unchanged() -> None:
    previous, decision = fresh()
    status, events = settle(previous, decision, False, None, True, T0)
    assert status is decision.status and events == decision.events


def test_transient_refusal_keeps_the_previous_status_and_shows_the_cause() -> None:
    previous, decision = fresh()
    status, events = settle(previous, decision, False, classify(403, SA), False, T0)
    # Not the decision's status: it counted the refused pods as created.
    assert cond(status, "Created") is None and status.replicas is None
    assert cond(status, BLOCKED) == ("True", "ServiceAccountNotFound")
    assert status.phase == "Pending" and status.completion_time is None
    assert status.start_time == T0  # the job's clock runs from the first try (activeDeadlineSeconds)
    assert [(e.type, e.reason) for e in events] == [("Warning", BLOCKED)]
    assert 'ServiceAccount "trainer"' in events[0].message


def test_the_same_refusal_again_posts_nothing_and_keeps_the_transition_time() -> None:
    previous, decision = fresh()
    blocked, _ = settle(previous, decision, False, classify(403, SA), False, T0)
    again = decide(written(blocked), JOB_UID, [], False, T1)
    status, events = settle(blocked, again, False, classify(403, SA), False, T1)
    assert events == [] and status.wire() == blocked.wire()  # nothing to write either


def test_a_new_cause_posts_again_without_moving_the_transition_time() -> None:
    previous, decision = fresh()
    blocked, _ = settle(previous, decision, False, classify(403, SA), False, T0)
    status, events = settle(
        blocked, decide(written(blocked), JOB_UID, [], False, T1), False, classify(403, QUOTA), False, T1
    )
    assert cond(status, BLOCKED) == ("True", "QuotaExceeded") and [e.reason for e in events] == [BLOCKED]
    condition = get_condition(status, BLOCKED)
    assert condition is not None and condition.last_transition_time == T0


def test_admitted_after_blocked_clears_the_condition() -> None:
    previous, decision = fresh()
    blocked, _ = settle(previous, decision, False, classify(403, SA), False, T0)
    again = decide(written(blocked), JOB_UID, [], False, T1)
    status, events = settle(blocked, again, False, None, True, T1)
    assert cond(status, BLOCKED) == ("False", "Admitted") and cond(status, "Created") == ("True", "PodsCreated")
    assert [e.reason for e in events] == ["Created"]  # the decision's own events
    # Nothing created in this pass (the names still taken by terminating pods): still blocked.
    unchanged, _ = settle(blocked, again, False, None, False, T1)
    assert cond(unchanged, BLOCKED) == ("True", "ServiceAccountNotFound")


def test_a_job_that_ended_while_blocked_is_no_longer_blocked() -> None:
    previous, decision = fresh()
    blocked, _ = settle(previous, decision, False, classify(403, SA), False, T0)
    suspended = written(blocked).model_copy(deep=True)
    suspended.spec.run_policy.suspend = True
    status, _ = settle(blocked, decide(suspended, JOB_UID, [], False, T1), False, None, False, T1)
    assert cond(status, BLOCKED) == ("False", "Suspended")


def test_a_job_blocked_for_ever_still_meets_its_deadline() -> None:
    job = make_job(activeDeadlineSeconds=10)
    blocked, _ = settle(TrainingJobStatus(), decide(job, JOB_UID, [], False, T0), False, classify(403, SA), False, T0)
    late = T0 + timedelta(seconds=10)
    expired = decide(make_job(blocked.wire(), activeDeadlineSeconds=10), JOB_UID, [], False, late)
    status, events = settle(blocked, expired, False, None, False, late)
    assert cond(status, "Failed") == ("True", "DeadlineExceeded") and cond(status, BLOCKED) == ("False", "Failed")
    assert [e.reason for e in events] == ["DeadlineExceeded"]


def test_an_invalid_pod_fails_the_job_at_once() -> None:
    previous, decision = fresh()
    blocked, _ = settle(previous, decision, False, classify(403, SA), False, T0)
    status, events = settle(
        blocked, decide(written(blocked), JOB_UID, [], False, T1), False, classify(422, INVALID), False, T1
    )
    assert cond(status, "Failed") == ("True", FAILED) and status.phase == "Failed"
    assert status.completion_time == T1 and cond(status, BLOCKED) == ("False", FAILED)
    assert [(e.type, e.reason) for e in events] == [("Warning", FAILED)] and INVALID in events[0].message


def test_a_committed_restart_keeps_its_status_and_events_when_the_new_pods_are_refused() -> None:
    job = make_job({"attempt": 0, "replicas": {"active": 2}})
    failed = pod_view(job, 0, phase="Failed", exit_code=1)
    running = pod_view(job, 1, phase="Running")
    restart = decide(job, JOB_UID, [failed, running], True, T1)
    assert restart.commit_first and restart.status.attempt == 1
    assert job.status is not None
    status, events = settle(job.status, restart, True, classify(403, QUOTA), False, T1)
    assert status.attempt == 1 and status.restarts == 1 and cond(status, BLOCKED) == ("True", "QuotaExceeded")
    assert [e.reason for e in events] == ["GangRestart", BLOCKED]
