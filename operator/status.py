"""Pure reconcile logic: (job, observed pods, now) → next status and the actions to take.

No client and no clock: `decide()` is a function of its arguments, so every path (gang
restart, deadline, suspend, TTL) is a table-driven unit test, and the handler only applies
the `Decision`. Level-based: nothing here depends on which event woke the operator.

Definitions the README repeats:
  * Success: every node's pod of the current attempt exited 0 (phase Succeeded). A job
    whose rank 0 finished while another rank hangs stays Running until its deadline; a job
    with any failed pod restarts the gang instead of succeeding.
  * Gang failure: a pod of the current attempt is Failed (any exit code, evicted), was
    deleted (terminating, or missing after all pods of the attempt had been observed), or is
    stuck waiting (ImagePullBackOff, CrashLoopBackOff, ...) and was scheduled longer than
    `stuck_timeout` ago (Kubernetes records no start of the wait; time waiting for a node
    does not count).
  * Gang restart: the failure is recorded, `attempt` and `restarts` go up (the status patch is
    the commit point and goes first), then every pod of older attempts is deleted and the
    new attempt's pods are created as their names free up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from kubetrain.api import naming
from kubetrain.api.models import (
    MAX_FAILURES_KEPT,
    Condition,
    Failure,
    Phase,
    ReplicaCounts,
    TrainingJob,
    TrainingJobStatus,
)

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
MESSAGE_TAIL = 2048


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _int_label(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key)
    return int(value) if value is not None and value.isdigit() else None


@dataclass(frozen=True)
class PodView:
    """What reconciling needs to know about one pod."""

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

    @classmethod
    def from_pod(cls, pod: dict[str, Any]) -> PodView:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        labels = meta.get("labels") or {}
        scheduled_condition = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        exit_code = waiting = reason = None
        message = ""
        finished = None
        for cs in status.get("containerStatuses") or []:
            if cs.get("name") != naming.CONTAINER_NAME:
                continue
            state = cs.get("state") or {}
            if "terminated" in state:
                terminated = state["terminated"] or {}
                exit_code = terminated.get("exitCode")
                reason = terminated.get("reason")
                message = terminated.get("message") or ""
                finished = parse_time(terminated.get("finishedAt"))
            elif "waiting" in state:
                waiting = (state["waiting"] or {}).get("reason")
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
        )


@dataclass(frozen=True)
class Policy:
    """Operator-wide knobs that are not part of a job's spec."""

    stuck_timeout: timedelta = timedelta(minutes=5)


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Decision:
    status: TrainingJobStatus
    create_service: bool = False
    create_ranks: list[int] = field(default_factory=list)
    # (name, uid): deleted with a uid precondition so that a same-named pod of a newer
    # attempt is never hit.
    delete_pods: list[tuple[str, str]] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    # The status must be written before anything is deleted: it records why (the failure,
    # the new attempt), and a crash after the deletes must not lose that.
    commit_first: bool = False

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


class StaleView(Exception):
    """Pods of a newer attempt than the status knows: the job body is out of date."""


# --- conditions -------------------------------------------------------------------------


def get_condition(status: TrainingJobStatus, kind: str) -> Condition | None:
    return next((c for c in status.conditions or [] if c.type == kind), None)


def is_true(status: TrainingJobStatus, kind: str) -> bool:
    condition = get_condition(status, kind)
    return condition is not None and condition.status == "True"


def _reason(text: str) -> str:
    """A metav1.Condition reason (CamelCase identifier) from free text such as 'OOMKilled'."""
    cleaned = re.sub(r"[^A-Za-z0-9_,:]", "", text) or "Unknown"
    if not cleaned[0].isalpha():
        cleaned = "Reason" + cleaned
    return cleaned.rstrip(",:")[:1024]


def set_condition(
    status: TrainingJobStatus,
    kind: str,
    value: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
    *,
    only_if_present: bool = False,
) -> bool:
    """Set a condition; lastTransitionTime moves only when its status flips. Returns whether it flipped."""
    conditions = list(status.conditions or [])
    wanted: Literal["True", "False"] = "True" if value else "False"
    existing = next((c for c in conditions if c.type == kind), None)
    if existing is None and only_if_present:
        return False
    flipped = existing is None or existing.status != wanted
    condition = Condition(
        type=kind,
        status=wanted,
        reason=_reason(reason),
        message=message[:32_768],
        last_transition_time=now if flipped or existing is None else existing.last_transition_time,
        observed_generation=generation,
    )
    if existing is None:
        conditions.append(condition)
    else:
        conditions[conditions.index(existing)] = condition
    status.conditions = conditions
    return flipped


def derive_phase(status: TrainingJobStatus) -> Phase:
    for kind in ("Failed", "Succeeded", "Suspended", "Restarting", "Running"):
        if is_true(status, kind):
            return kind
    return "Pending"


# --- the decision -----------------------------------------------------------------------


def _counts(pods: list[PodView]) -> ReplicaCounts:
    return ReplicaCounts(
        active=sum(p.phase not in TERMINAL_PHASES for p in pods),
        ready=sum(p.phase == "Running" for p in pods),
        succeeded=sum(p.phase == "Succeeded" for p in pods),
        failed=sum(p.phase == "Failed" for p in pods),
    )


def _seen(counts: ReplicaCounts | None) -> int:
    return 0 if counts is None else counts.active + counts.succeeded + counts.failed


def _failure_of(pod: PodView, attempt: int, kind: str, now: datetime) -> Failure:
    if kind == "deleted":
        reason, message = "PodDeleted", f"pod {pod.name} was deleted while the attempt ran"
    elif kind == "stuck":
        reason = pod.waiting_reason or "Stuck"
        message = f"pod {pod.name} waited in {reason} longer than the stuck timeout"
    else:
        reason = pod.reason or ("Error" if pod.exit_code else "Failed")
        message = pod.message
    return Failure(
        attempt=attempt,
        rank=pod.rank,
        pod=pod.name,
        node=pod.node,
        exit_code=pod.exit_code,
        reason=reason[:256],
        message=message[-MESSAGE_TAIL:],
        time=pod.finished or now,
    )


def _describe(failure: Failure) -> str:
    what = f"node {failure.rank} (pod {failure.pod}"
    what += f" on {failure.node})" if failure.node else ")"
    code = f" with exit code {failure.exit_code}" if failure.exit_code is not None else ""
    detail = f": {failure.message.strip().splitlines()[-1]}" if failure.message.strip() else ""
    return f"{what} failed{code} ({failure.reason}){detail}"[:1024]


def decide(
    job: TrainingJob,
    uid: str,
    pods: list[PodView],
    service_exists: bool,
    now: datetime,
    policy: Policy = Policy(),
) -> Decision:
    spec, run = job.spec, job.spec.run_policy
    generation = job.metadata.generation
    previous = job.status or TrainingJobStatus()
    status = previous.model_copy(deep=True)
    status.observed_generation = generation
    decision = Decision(status=status)

    def condition(kind: str, value: bool, reason: str, message: str, *, only_if_present: bool = False) -> bool:
        return set_condition(status, kind, value, reason, message, now, generation, only_if_present=only_if_present)

    ours = [p for p in pods if p.job_uid in (None, uid)]
    occupied = {p.name for p in pods}
    if any(p.attempt is not None and p.attempt > status.attempt for p in ours):
        raise StaleView(f"pods of an attempt newer than {status.attempt}")
    live = [p for p in ours if not p.terminating]
    current = [p for p in live if p.attempt == status.attempt]
    stale = [p for p in live if p.attempt != status.attempt]

    def finish(success: bool, reason: str, message: str) -> None:
        condition("Succeeded" if success else "Failed", True, reason, message)
        condition("Running", False, "Succeeded" if success else "Failed", message, only_if_present=True)
        condition("Restarting", False, reason, message, only_if_present=True)
        status.completion_time = now
        decision.commit_first = True
        decision.events.append(Event("Normal" if success else "Warning", reason, message))

    finished = is_true(status, "Succeeded") or is_true(status, "Failed")

    # --- suspend / resume -----------------------------------------------------------
    if not finished and run.suspend:
        if condition("Suspended", True, "Suspended", "runPolicy.suspend is true: the pods are deleted"):
            decision.events.append(Event("Normal", "Suspended", "job suspended: pods deleted"))
            condition("Running", False, "Suspended", "the job is suspended", only_if_present=True)
            condition("Restarting", False, "Suspended", "the job is suspended", only_if_present=True)
        if current:
            # The resumed gang is a fresh attempt; suspension is not a failure and does not
            # count against maxRestarts.
            status.attempt += 1
        # As for a batch/v1 Job, the deadline clock stops while suspended and restarts on resume.
        status.start_time = None
        status.replicas = ReplicaCounts()
        decision.delete_pods = [(p.name, p.uid) for p in live]
        decision.commit_first = True
        status.phase = derive_phase(status)
        return decision
    if not finished and is_true(status, "Suspended"):
        condition("Suspended", False, "Resumed", "runPolicy.suspend is false: the gang is recreated")
        decision.events.append(Event("Normal", "Resumed", "job resumed"))

    # --- the current attempt --------------------------------------------------------
    if not finished:
        by_rank = {p.rank: p for p in current if p.rank is not None}
        seen_all = previous.attempt == status.attempt and _seen(previous.replicas) >= spec.nodes
        # The first failure in time is the cause; the others are usually its consequence.
        failed = sorted((p for p in current if p.phase == "Failed"), key=lambda p: (p.finished or now, p.rank or 0))
        problems: list[tuple[PodView, str]] = [(p, "failed") for p in failed]
        deleted = [p for p in ours if p.terminating and p.attempt == status.attempt]
        problems += [(p, "deleted") for p in deleted]
        if seen_all:
            # Every pod of this attempt was observed once: a missing one was deleted (and is
            # already gone), not "not created yet".
            gone = {p.rank for p in deleted}
            problems += [
                (PodView(naming.pod_name(job.name, r), "", uid, r, status.attempt, "Unknown", True, None), "deleted")
                for r in range(spec.nodes)
                if r not in by_rank and r not in gone
            ]
        for p in current:
            since = p.scheduled_at or p.created
            if p.phase == "Pending" and p.waiting_reason in STUCK_REASONS and since is not None:
                due = since + policy.stuck_timeout
                if now >= due:
                    problems.append((p, "stuck"))
                else:
                    decision.requeue((due - now).total_seconds())

        if problems:
            pod, kind = problems[0]
            failure = _failure_of(pod, status.attempt, kind, now)
            status.failures = [*(status.failures or []), failure][-MAX_FAILURES_KEPT:]
            decision.commit_first = True
            if status.restarts < run.max_restarts:
                status.restarts += 1
                status.attempt += 1
                message = (
                    f"{_describe(failure)}; restarting the whole gang as attempt {status.attempt} "
                    f"(restart {status.restarts} of {run.max_restarts})"
                )
                condition("Restarting", True, failure.reason, message)
                condition("Running", False, "Restarting", message, only_if_present=True)
                decision.events.append(Event("Warning", "GangRestart", message))
                status.replicas = ReplicaCounts()
                stale, current = live, []
            else:
                finish(
                    False,
                    "BackoffLimitExceeded",
                    f"{_describe(failure)}; no restarts left (maxRestarts {run.max_restarts})",
                )
                finished = True
        elif current and len(by_rank) == spec.nodes and all(p.phase == "Succeeded" for p in current):
            finish(True, "AllNodesSucceeded", f"all {spec.nodes} nodes exited 0")
            finished = True
        elif run.active_deadline_seconds is not None and status.start_time is not None:
            due = status.start_time + timedelta(seconds=run.active_deadline_seconds)
            if now >= due:
                finish(
                    False,
                    "DeadlineExceeded",
                    f"job ran longer than activeDeadlineSeconds={run.active_deadline_seconds}",
                )
                finished = True
            else:
                decision.requeue((due - now).total_seconds())
        if not finished and run.scheduling_timeout_seconds is not None:
            # A pod the scheduler explained comes first: its message is the useful one.
            for p in sorted(current, key=lambda p: (not p.schedule_message, p.rank or 0)):
                if p.phase != "Pending" or p.scheduled or p.created is None:
                    continue
                due = p.created + timedelta(seconds=run.scheduling_timeout_seconds)
                if now >= due:
                    detail = p.schedule_message or "no scheduler placed it"
                    finish(
                        False,
                        "Unschedulable",
                        f"pod {p.name} was not scheduled within schedulingTimeoutSeconds="
                        f"{run.scheduling_timeout_seconds}: {detail}",
                    )
                    finished = True
                    break
                decision.requeue((due - now).total_seconds())

    # --- finished: clean up and expire ----------------------------------------------
    if finished:
        if run.clean_pod_policy == "All":
            doomed = live
        elif run.clean_pod_policy == "Running":
            doomed = [p for p in live if p.phase not in TERMINAL_PHASES]
        else:
            doomed = []
        decision.delete_pods = [(p.name, p.uid) for p in doomed]
        if status.completion_time is not None and run.ttl_seconds_after_finished is not None:
            due = status.completion_time + timedelta(seconds=run.ttl_seconds_after_finished)
            if now >= due:
                decision.delete_job = True
            else:
                decision.requeue((due - now).total_seconds())
        status.replicas = _counts([p for p in current if p.attempt == status.attempt])
        status.phase = derive_phase(status)
        return decision

    # --- converge: create what is missing, delete older attempts --------------------
    decision.delete_pods = [(p.name, p.uid) for p in stale]
    by_rank = {p.rank: p for p in current if p.rank is not None}
    missing = [r for r in range(spec.nodes) if r not in by_rank]
    decision.create_ranks = [r for r in missing if naming.pod_name(job.name, r) not in occupied]
    decision.create_service = not service_exists
    if decision.delete_pods:
        decision.commit_first = True
    if decision.create_ranks and status.start_time is None:
        status.start_time = now
        if run.active_deadline_seconds is not None:
            decision.requeue(run.active_deadline_seconds)

    # Pods created in this pass count as observed only when they are created before the
    # status is written; otherwise the next pass observes them.
    assumed = [] if decision.commit_first else decision.create_ranks
    counts = _counts(current)
    counts.active += len(assumed)
    status.replicas = counts
    exists = len(by_rank) + len(assumed)
    if exists == spec.nodes and condition(
        "Created", True, "PodsCreated", f"headless Service {naming.service_name(job.name)} and {spec.nodes} pods"
    ):
        decision.events.append(
            Event("Normal", "Created", f"created headless Service and {spec.nodes} pods (attempt {status.attempt})")
        )
    # Ranks that already exited 0 wait for the others: the gang still runs.
    if len(by_rank) == spec.nodes and all(p.phase in ("Running", "Succeeded") for p in current):
        message = f"all {spec.nodes} pods of attempt {status.attempt} are running"
        if condition("Running", True, "AllPodsRunning", message):
            decision.events.append(Event("Normal", "Running", message))
        condition("Restarting", False, "AllPodsRunning", message, only_if_present=True)
    else:
        condition(
            "Running",
            False,
            "Restarting" if is_true(status, "Restarting") else "PodsNotRunning",
            f"{sum(p.phase == 'Running' for p in current)} of {spec.nodes} pods running",
            only_if_present=True,
        )
    status.phase = derive_phase(status)
    return decision
