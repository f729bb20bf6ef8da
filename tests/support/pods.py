"""The one PodView builder of the tests: a pod rendered for the job exactly as the operator creates
it, given the status a kubelet would report, read back through `PodView.from_pod` — so a test sees
what the reconciler sees, not a hand-filled view."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob
from kubetrain.operator.pods import PodView
from kubetrain.operator.render import render_pod

JOB_UID = "job-uid"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_view(
    job: TrainingJob,
    rank: int,
    attempt: int = 0,
    phase: str = "Pending",
    *,
    job_uid: str = JOB_UID,
    created: datetime = T0,
    exit_code: int | None = None,
    reason: str | None = None,
    message: str = "Traceback\nboom",
    finished: datetime | None = None,
    terminating: bool = False,
    waiting: str | None = None,
    node: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
    ready: bool = False,
) -> PodView:
    """Node `rank`'s pod of `attempt` in `phase`; `exit_code` makes its container terminated,
    `waiting` a waiting reason, `conditions` pod conditions (e.g. DisruptionTarget), `ready` a
    Ready condition (with a running container: started at `created`)."""
    body = render_pod(job, job.metadata.namespace or "ns", job_uid, rank, attempt)
    body["metadata"]["uid"] = f"pod-{rank}-{attempt}"
    body["metadata"]["creationTimestamp"] = _stamp(created)
    if terminating:
        body["metadata"]["deletionTimestamp"] = _stamp(created)
    if node:
        body["spec"]["nodeName"] = node
    state: dict[str, Any] = {}
    if exit_code is not None:
        terminated: dict[str, Any] = {"exitCode": exit_code, "reason": reason or "Error", "message": message}
        if finished is not None:
            terminated["finishedAt"] = _stamp(finished)
        state = {"terminated": terminated}
    elif waiting:
        state = {"waiting": {"reason": waiting}}
    elif phase == "Running":
        state = {"running": {"startedAt": _stamp(created)}}
    conditions = list(conditions or [])
    if ready:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": _stamp(created)})
    body["status"] = {
        "phase": phase,
        "containerStatuses": [{"name": naming.CONTAINER_NAME, "state": state}] if state else [],
        "conditions": conditions,
    }
    return PodView.from_pod(body)
