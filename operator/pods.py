"""What reconciling needs to know about one pod: `PodView`, read from a Pod or built field by
field (the local runner builds them from processes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubetrain.api import naming
from kubetrain.api.records import GangFailure

# Waiting reasons a pod does not recover from by itself, or only by luck: after
# `stuck_timeout` they count as a failure of the gang.
STUCK_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# A pod whose init container (kubetrain's runtime, or the template's) failed, so the trainer never ran.
INIT_CONTAINER_FAILED = "InitContainerFailed"


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _int_label(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key)
    return int(value) if value is not None and value.isdigit() else None


@dataclass(frozen=True, slots=True)
class PodCondition:
    """A pod condition, as failurePolicy.rules[].onPodConditions matches it."""

    type: str
    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class PodView:
    """What reconciling needs to know about one pod. The operator's pod index holds these, not
    the pods: a finished pod parsed from JSON holds ~26 KB, its view ~2 KB."""

    name: str
    uid: str
    job_uid: str | None
    rank: int | None
    attempt: int | None
    phase: str
    terminating: bool
    created: datetime | None
    node: str | None = None
    scheduled: bool = False
    # When the scheduler placed it: a pod that waited for a node has not been stuck meanwhile.
    scheduled_at: datetime | None = None
    schedule_message: str = ""
    waiting_reason: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str = ""
    finished: datetime | None = None
    conditions: tuple[PodCondition, ...] = ()
    # When the trainer container started running (the attempt's timeline).
    started: datetime | None = None
    # Readiness: with the in-place restart, the pod's torchrun agent listens on the readiness
    # probe's port while it runs the workers of the pod's attempt (runtime/agent/inplace.py); `ready_at`
    # is when the Ready condition last changed.
    ready: bool = False
    ready_at: datetime | None = None
    # The pod's IP: where the operator orders an in-place restart (its agent port).
    ip: str | None = None
    # The gang failure an agent of this pod's attempt reported (its `failure` record), attached
    # by the caller that read it: the controller from a pod's log, the local runner from the output.
    held: GangFailure | None = None
    # The trainer container runs or ran: the pod has a log (operator/archive.py).
    has_run: bool = False
    # Deletion, as the API server records it: deletionTimestamp is when the grace period ends;
    # a grace of 0 is the kubelet's final delete once the containers stopped (or a forced one).
    deleted_at: datetime | None = None
    deletion_grace: int | None = None
    finalizers: tuple[str, ...] = ()

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodView:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        labels = meta.get("labels") or {}
        scheduled_condition = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        exit_code = waiting = reason = None
        message = ""
        finished = started = None
        has_run = False
        for cs in status.get("containerStatuses") or []:
            if cs.get("name") != naming.CONTAINER_NAME:
                continue
            state = cs.get("state") or {}
            has_run = "running" in state or "terminated" in state
            if "running" in state:
                started = parse_time((state["running"] or {}).get("startedAt"))
            if "terminated" in state:
                terminated = state["terminated"] or {}
                exit_code = terminated.get("exitCode")
                reason = terminated.get("reason")
                message = terminated.get("message") or ""
                finished = parse_time(terminated.get("finishedAt"))
            elif "waiting" in state:
                waiting = (state["waiting"] or {}).get("reason")
        # The trainer waits in PodInitializing while an init container or native sidecar
        # (spec.template) cannot start: that container's reason is the pod's.
        for cs in status.get("initContainerStatuses") or []:
            init_reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
            if init_reason in STUCK_REASONS and waiting not in STUCK_REASONS:
                waiting = init_reason
            init_done = (cs.get("state") or {}).get("terminated") or {}
            if init_done.get("exitCode") and not has_run and reason is None:
                # The trainer never started (restartPolicy Never): the init container's end is the pod's.
                reason = INIT_CONTAINER_FAILED
                said = (init_done.get("message") or "").strip()
                message = f"init container {cs.get('name')} exited {init_done['exitCode']}" + (
                    f": {said}" if said else ""
                )
                finished = parse_time(init_done.get("finishedAt"))
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if status.get("reason"):  # pod-level: Evicted, DeadlineExceeded, NodeLost, ...
            reason = status["reason"]
            message = status.get("message") or message
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            job_uid=labels.get(naming.LABEL_JOB_UID),
            rank=_int_label(labels, naming.LABEL_NODE_RANK),
            attempt=_int_label(labels, naming.LABEL_ATTEMPT),
            phase=status.get("phase") or "Pending",
            terminating=bool(meta.get("deletionTimestamp")),
            created=parse_time(meta.get("creationTimestamp")),
            node=spec.get("nodeName"),
            scheduled=bool(spec.get("nodeName"))
            or (scheduled_condition is not None and scheduled_condition.get("status") == "True"),
            scheduled_at=parse_time(scheduled_condition.get("lastTransitionTime"))
            if scheduled_condition is not None and scheduled_condition.get("status") == "True"
            else None,
            schedule_message=(scheduled_condition or {}).get("message") or "",
            waiting_reason=waiting,
            exit_code=exit_code,
            reason=reason,
            message=message,
            finished=finished,
            conditions=tuple(
                PodCondition(c.get("type", ""), c.get("status", ""), c.get("reason") or "", c.get("message") or "")
                for c in status.get("conditions") or []
            ),
            started=started,
            has_run=has_run,
            deleted_at=parse_time(meta.get("deletionTimestamp")),
            deletion_grace=meta.get("deletionGracePeriodSeconds"),
            finalizers=tuple(meta.get("finalizers") or ()),
            ready=ready is not None and ready.get("status") == "True",
            ready_at=parse_time(ready.get("lastTransitionTime")) if ready is not None else None,
            ip=status.get("podIP") or None,
        )
