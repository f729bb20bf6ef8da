"""Pure: a pod or Service the API server refused, and what the job's status says about it.

The API server refuses a create with 403 or 422. Some refusals pass by themselves once
something else exists or frees up; those are retried with backoff while the job shows
condition PodCreationBlocked (a Warning Event when its reason or message changes, not on
every retry) and recover on their own, as Kubernetes' Job controller does. Every other
refusal would refuse the same pod forever: the job fails at once with PodCreationFailed.

| condition reason       | the API server's words (403)                        | who fixes it        |
|------------------------|-----------------------------------------------------|---------------------|
| ServiceAccountNotFound | error looking up service account <ns>/<name>        | whoever creates it  |
| PriorityClassNotFound  | no PriorityClass with name <name> was found         | the cluster admin   |
| QuotaExceeded          | exceeded quota: <name>, requested ..., used ...     | other jobs finish   |
| QuotaNotReady          | status unknown for quota: <name>                    | the quota controller|
| NamespaceTerminating   | ... because it is being terminated                  | (the job goes too)  |
| OperatorForbidden      | User "<operator>" cannot create resource ...        | the operator's admin|

Failing fast: 422 (invalid: a port name over 15 characters, an env var name with '='),
and any other 403 (Pod Security, a ValidatingAdmissionPolicy or webhook, a quota that
requires a field the pods do not set).

A ConfigMap, Secret or PVC that does not exist is not refused here: the pod is created and
waits (CreateContainerConfigError, unschedulable), which `status.decide` handles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from kubetrain.api.models import TrainingJobStatus
from kubetrain.operator.conditions import derive_phase, get_condition, set_condition
from kubetrain.operator.decision import Decision, Event

BLOCKED = "PodCreationBlocked"
FAILED = "PodCreationFailed"
MESSAGE_LIMIT = 1024

# (condition reason, the API server's words with the object's name, what the condition says)
TRANSIENT: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (
        "ServiceAccountNotFound",
        re.compile(r"error looking up service account [^/\s]+/(?P<name>[^:\s]+)"),
        'ServiceAccount "{name}" does not exist',
    ),
    (
        "PriorityClassNotFound",
        re.compile(r"no PriorityClass with name (?P<name>.+?) was found"),
        'PriorityClass "{name}" does not exist',
    ),
    ("QuotaExceeded", re.compile(r"exceeded quota: (?P<name>[^,\s]+)"), 'ResourceQuota "{name}" is used up'),
    (
        "QuotaNotReady",
        re.compile(r"status unknown for quota: (?P<name>[^,\s]+)"),
        'ResourceQuota "{name}" has no usage computed yet',
    ),
    ("NamespaceTerminating", re.compile(r"because it is being terminated"), "the namespace is being deleted"),
    (
        "OperatorForbidden",
        re.compile(r'User "(?P<name>[^"]+)" cannot create resource'),
        "the operator ({name}) may not create it: check its RBAC",
    ),
)


@dataclass(frozen=True)
class Refusal:
    """Why the API server refused an object, and whether retrying can help."""

    transient: bool
    reason: str  # the condition's reason
    message: str  # what is missing or used up, then the API server's own words


def classify(status: int, message: str) -> Refusal:
    """What a 403/422 answer to a create means (see the table in the module docstring)."""
    if status == 403:
        for reason, pattern, what in TRANSIENT:
            if (match := pattern.search(message)) is not None:
                summary = what.format(**match.groupdict())
                return Refusal(True, reason, f"{summary}; retrying with backoff: {message}"[:MESSAGE_LIMIT])
    return Refusal(False, FAILED, f"the API server refused a pod: {message}"[:MESSAGE_LIMIT])


def settle(
    previous: TrainingJobStatus,
    decision: Decision,
    committed: bool,
    refusal: Refusal | None,
    created: bool,
    now: datetime,
) -> tuple[TrainingJobStatus, list[Event]]:
    """The status to write and the events to post once `decision`'s creations ran.

    `committed`: the decision's status was written before the creations (a gang restart);
    otherwise it counted the pods as created and must not be written when they were refused:
    the status stays `previous`, except that the job's clock starts at the first try (a job
    blocked for ever still meets its activeDeadlineSeconds, as a batch/v1 Job does).
    `created`: at least one object was created (or existed).
    """
    if refusal is None:
        return _admitted(decision.status, created, now), decision.events
    if committed:
        status = decision.status.model_copy(deep=True)
    else:
        status = previous.model_copy(deep=True)
        status.observed_generation = decision.status.observed_generation
        status.start_time = status.start_time or decision.status.start_time
    generation = status.observed_generation
    events = list(decision.events) if committed else []
    if refusal.transient:
        shown = get_condition(status, BLOCKED)
        if shown is None or (shown.status, shown.reason, shown.message) != ("True", refusal.reason, refusal.message):
            events.append(Event("Warning", BLOCKED, refusal.message))
        set_condition(status, BLOCKED, True, refusal.reason, refusal.message, now, generation)
    else:
        set_condition(status, "Failed", True, FAILED, refusal.message, now, generation)
        set_condition(status, BLOCKED, False, FAILED, refusal.message, now, generation, only_if_present=True)
        status.completion_time = now
        events.append(Event("Warning", FAILED, refusal.message))
    status.phase = derive_phase(status)
    return status, events


def _admitted(status: TrainingJobStatus, created: bool, now: datetime) -> TrainingJobStatus:
    """PodCreationBlocked goes False once a creation passes, or when the job no longer wants
    pods (finished, suspended). A pass that created nothing else leaves it as it is: the
    names of the refused pods may still be taken by the old attempt's terminating pods."""
    blocked = get_condition(status, BLOCKED)
    if blocked is None or blocked.status != "True":
        return status
    phase = derive_phase(status)
    if created:
        reason, message = "Admitted", "the API server admitted the pods"
    elif phase in ("Succeeded", "Failed", "Suspended"):
        reason, message = phase, f"the job is {phase.lower()}: no pods to create"
    else:
        return status
    status = status.model_copy(deep=True)
    set_condition(status, BLOCKED, False, reason, message, now, status.observed_generation)
    return status
