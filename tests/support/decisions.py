"""`status.decide` driven by hand, one pass at a time: `make_job` (the job it decides for), `step`
(one pass on the given pods), `advance` (the job as the API server holds it after that pass's
status write), `cond` (a condition as (status, reason)) and `message_of` (a condition's message)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.operator.conditions import get_condition
from kubetrain.operator.decision import DEFAULT_POLICY, Decision, Policy
from kubetrain.operator.pods import PodView
from kubetrain.operator.status import decide
from support.jobs import bare_job
from support.pods import JOB_UID, T0


def make_job(status: dict[str, Any] | None = None, generation: int = 1, **spec: Any) -> TrainingJob:
    """Job `ns/j` of uid support.pods.JOB_UID, three nodes unless `spec` says otherwise."""
    spec.setdefault("nodes", 3)
    metadata = {"namespace": "ns", "uid": JOB_UID, "generation": generation}
    return TrainingJob.model_validate(bare_job(metadata=metadata, status=status, **spec))


def step(
    job: TrainingJob,
    pods: Sequence[PodView] = (),
    now: datetime = T0,
    service: bool = True,
    policy: Policy = DEFAULT_POLICY,
) -> Decision:
    """One pass of the job's uid (support.pods.JOB_UID) on `pods`, its Service there or not."""
    return decide(job, JOB_UID, list(pods), service, now, policy)


def advance(job: TrainingJob, decision: Decision) -> TrainingJob:
    """The job as the API server holds it after the decision's status was written."""
    return job.model_copy(update={"status": TrainingJobStatus.model_validate(decision.status.wire())})


def cond(decided: Decision | TrainingJobStatus, kind: str) -> tuple[str, str] | None:
    """The condition `kind` of a decision's status (or of a status) as (status, reason)."""
    status = decided.status if isinstance(decided, Decision) else decided
    c = get_condition(status, kind)
    return None if c is None else (c.status, c.reason)


def message_of(decision: Decision, kind: str) -> str:
    condition = get_condition(decision.status, kind)
    assert condition is not None, kind
    return condition.message
