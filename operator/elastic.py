"""Elastic gangs (spec.elastic): which nodes train in an attempt, and when the gang changes size.

Pure rules that `status.decide` applies; docs/elastic.md repeats them.

  * Members: the node ranks (pod name suffixes) that form the attempt's gang, in gang order
    (status.members). A job without spec.elastic has every node as a member, always. Every other
    pod of the attempt is on standby: its torchrun agent is up and waits (its pod Ready, its
    `standby` record) until an attempt names it, so the scheduler's capacity decides who trains.
  * An elastic job starts with no member: its first gang forms once at least minNodes pods are on
    standby and every pod that is not waiting for a node is (the pods that can run, all of them).
  * Shrink: a member's pod lost (Failed, deleted, evicted, gone) while node 0's pod lives and at
    least minNodes members remain: the next attempt's gang is those that remain, restarted in
    place and counted against no budget. Fewer remain: the next attempt has no member and the job
    waits (condition BelowMinNodes) for capacity, counted against no budget either. The lost pod
    is created again and waits on standby. Node 0's agent hosts the gang's store, so its loss is
    a gang failure as in a job without a range (its pod is recreated with the others).
  * A standby pod that fails is not a failure of the gang: it is deleted and created again, after
    a back-off that doubles with each failure in a row (STANDBY_BACKOFF, as the kubelet's
    CrashLoopBackOff), so that a pod that can only fail does not churn. Joining a gang resets it.
  * Grow: standby pods Ready while the gang trains, and scaleUpCooldownSeconds passed since the
    last resize (none when the gang is below its minimum): the next attempt adds them. The
    members' agents stop their workers with SIGTERM, so the trainer's stop vote saves the step it
    is at, and restart them at the new size.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from kubetrain.api.models import MAX_RESIZES_KEPT, Resize, StandbyFailure, TrainingJobSpec, TrainingJobStatus
from kubetrain.operator.pods import PodView

CONDITION = "BelowMinNodes"
LOST = "NodeLost"
GROWN = "CapacityReturned"
FORMED = "GangFormed"
STANDBY_FAILED = "StandbyPodFailed"
# A failed standby pod's next creation: 10 s after its first failure in a row, doubling, at most 5 min.
STANDBY_BACKOFF = timedelta(seconds=10)
STANDBY_BACKOFF_MAX = timedelta(minutes=5)


def members(spec: TrainingJobSpec, status: TrainingJobStatus) -> list[int]:
    """The node ranks of the current attempt's gang."""
    if spec.elastic is None or status.members is None:
        return list(range(spec.nodes))
    return list(status.members)


def range_text(spec: TrainingJobSpec) -> str:
    low = spec.elastic.min_nodes if spec.elastic is not None else spec.nodes
    return f"{low}-{spec.nodes}"


def first_gang(spec: TrainingJobSpec, ready: Sequence[PodView], waiting: Sequence[PodView]) -> list[int] | None:
    """The ranks of the first gang of a job with no member yet (or below its minimum), or None to
    wait: at least minNodes standby pods Ready, and no other pod that runs (only pods waiting for
    a node, whose capacity may never come, are left out)."""
    assert spec.elastic is not None
    if len(ready) < spec.elastic.min_nodes or any(p.phase == "Running" for p in waiting):
        return None
    return sorted(p.rank for p in ready if p.rank is not None)


def cooldown_due(spec: TrainingJobSpec, status: TrainingJobStatus) -> datetime | None:
    """When the gang may grow again: scaleUpCooldownSeconds after its last resize."""
    assert spec.elastic is not None
    last = status.resizes[-1].time if status.resizes else None
    return None if last is None else last + timedelta(seconds=spec.elastic.scale_up_cooldown_seconds)


def record(
    status: TrainingJobStatus, before: Sequence[int], after: Sequence[int], reason: str, message: str, now: datetime
) -> Resize:
    """Set the current attempt's members and keep the resize in status.resizes."""
    step = status.progress.step if status.progress is not None else None
    resize = Resize(
        attempt=status.attempt,
        from_size=len(before),
        to_size=len(after),
        reason=reason[:256],
        message=message[:1024],
        step=step,
        time=now,
    )
    status.members, status.size = list(after), len(after)
    status.resizes = [*(status.resizes or []), resize][-MAX_RESIZES_KEPT:]
    return resize


def describe_nodes(ranks: Sequence[int]) -> str:
    return ", ".join(str(rank) for rank in ranks) if ranks else "none"


def standby_backoff(count: int) -> timedelta:
    """How long a node waits to be created again after its `count`-th standby failure in a row."""
    backoff: timedelta = STANDBY_BACKOFF * 2 ** min(count - 1, 16)
    return min(backoff, STANDBY_BACKOFF_MAX)


def count_standby_failure(
    status: TrainingJobStatus, node: int, pod_uid: str, message: str, now: datetime
) -> StandbyFailure | None:
    """Record that node's standby pod `pod_uid` failed; the entry, or None when that pod was
    counted already (a failed pod is seen until its deletion is)."""
    entries = status.standby_failures or []
    before = next((e for e in entries if e.node == node), None)
    if before is not None and before.pod_uid == pod_uid:
        return None
    entry = StandbyFailure(
        node=node, pod_uid=pod_uid, count=(before.count if before else 0) + 1, last_at=now, message=message[:1024]
    )
    status.standby_failures = sorted([*(e for e in entries if e.node != node), entry], key=lambda e: e.node)
    return entry


def forget_standby_failures(status: TrainingJobStatus, joined: Sequence[int]) -> None:
    """Nodes in the gang start afresh: their next standby failure waits the first back-off again."""
    kept = [e for e in status.standby_failures or [] if e.node not in joined]
    status.standby_failures = kept or None


def standby_due(status: TrainingJobStatus, node: int) -> datetime | None:
    """When a node whose standby pod failed may be created again (None: it never failed)."""
    entry = next((e for e in status.standby_failures or [] if e.node == node), None)
    return None if entry is None else entry.last_at + standby_backoff(entry.count)
