"""Pure: the current attempt's start-up timeline (status.timeline) and what it waits on now.

`begin` opens an attempt's timeline when decide() starts it (the job's first pods, a restart in
place or by recreating the gang, a resume); `advance` fills in, from the pods, when the last pod
of the attempt was created, bound and started; the trainer's and agent's records fill in the
rest (`kubetrain.api.records.fold_timeline`: workers started, rendezvous, first step). Every
time is set once and never before the one ahead of it, so the phases are monotone and add up
to the time from the failure (or the attempt's decision) to the first step:

    failure → detected → pods created → scheduled → containers started → workers started
            → rendezvous → first step

An in-place restart skips the pods' three. `waiting_on` says, in words, which phase the attempt
is in and why it is not past it yet (the scheduler's message, a container's waiting reason).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from kubetrain.api.models import AttemptStart, Timeline
from kubetrain.operator.pods import PodView

# (field, the phase that ends at it), in order.
PHASES = (
    ("detected_at", "detect"),
    ("pods_created_at", "create pods"),
    ("pods_scheduled_at", "schedule"),
    ("containers_started_at", "start containers"),
    ("workers_started_at", "start workers"),
    ("rendezvous_at", "rendezvous"),
    ("first_step_at", "first step"),
)


def begin(
    attempt: int, start: AttemptStart, *, failed_at: datetime | None = None, detected_at: datetime | None = None
) -> Timeline:
    return Timeline(attempt=attempt, start=start, failed_at=failed_at, detected_at=detected_at)


def _last(times: Sequence[datetime | None]) -> datetime | None:
    return None if not times or any(t is None for t in times) else max(t for t in times if t is not None)


def advance(
    timeline: Timeline, pods: Sequence[PodView], nodes: int, *, creating: int = 0, now: datetime | None = None
) -> Timeline:
    """The pods' phases of the timeline (not for an in-place restart: its pods were there), each
    once every node's pod passed it; then every time clamped so none precedes the one before it,
    and `phases` and `waitingOn` rewritten. `creating` pods are being created `now` (counted as
    created: the status that records them is written after them)."""
    update: dict[str, Any] = {}
    if timeline.start != "InPlace" and len({p.rank for p in pods}) + creating == nodes:
        created = [p.created for p in pods] + [now] * creating
        if timeline.pods_created_at is None and (last := _last(created)) is not None:
            update["pods_created_at"] = last
    if timeline.start != "InPlace" and len({p.rank for p in pods}) == nodes:
        for field, times in (
            ("pods_scheduled_at", [p.scheduled_at or (p.created if p.scheduled else None) for p in pods]),
            ("containers_started_at", [p.started for p in pods]),
        ):
            if getattr(timeline, field) is None and (last := _last(times)) is not None:
                update[field] = last
    settled = _settle(timeline.model_copy(update=update) if update else timeline)
    return settled.model_copy(update={"waiting_on": waiting_on(settled, pods, nodes, creating)[:4096]})


def _settle(timeline: Timeline) -> Timeline:
    """Clamp each time to the one before it (API times have whole seconds, records do not), and
    write `phases`."""
    update: dict[str, Any] = {}
    previous = timeline.failed_at
    parts = []
    for field, phase in PHASES:
        value = getattr(timeline, field)
        if value is None:
            continue
        if previous is not None and value < previous:
            value = previous
            update[field] = value
        if previous is not None:
            parts.append(f"{phase} {(value - previous).total_seconds():.1f}s")
        previous = value
    total = ""
    if timeline.first_step_at is not None:
        origin = timeline.failed_at or timeline.detected_at or timeline.pods_created_at
        if origin is not None:
            total = f" = {((update.get('first_step_at') or timeline.first_step_at) - origin).total_seconds():.1f}s"
    update["phases"] = (", ".join(parts) + total)[:1024]
    return timeline.model_copy(update=update)


def seconds(timeline: Timeline) -> float | None:
    """From the failure (else the attempt's decision, else its first pod) to the first step."""
    origin = timeline.failed_at or timeline.detected_at or timeline.pods_created_at
    if timeline.first_step_at is None or origin is None:
        return None
    return (timeline.first_step_at - origin).total_seconds()


def waiting_on(timeline: Timeline, pods: Sequence[PodView], nodes: int, creating: int = 0) -> str:
    """What the attempt waits on now, in words; "" once rank 0 finished its first step.
    `creating`: pods being created in this pass (not observed yet: not bound yet either)."""
    if timeline.first_step_at is not None:
        return ""
    if timeline.start != "InPlace":
        by_rank = {p.rank: p for p in pods if p.rank is not None}
        if len(by_rank) + creating < nodes:
            return f"pod creation: {len(by_rank)} of {nodes} pods exist"
        unbound = sorted(((p.rank or 0, p.schedule_message) for p in pods if not p.scheduled), key=lambda u: u[0])
        if unbound or creating:
            rank, said = unbound[0] if unbound else (min(set(range(nodes)) - set(by_rank), default=0), "")
            said = said or "no scheduler has placed it yet"
            return f"scheduling: {len(unbound) + creating} of {nodes} pods not bound; node {rank}: {said}"
        starting = sorted(((p.rank or 0, p) for p in pods if p.phase == "Pending"), key=lambda u: u[0])
        if starting:
            rank, pod = starting[0]
            why = pod.waiting_reason or "starting"
            return f"containers: {len(starting)} of {nodes} not running; node {rank}: {why}"
    else:
        holding = sorted(p.rank or 0 for p in pods if not p.ready)
        if timeline.workers_started_at is None and holding:
            listed = ", ".join(str(rank) for rank in holding)
            return f"workers: the torchrun agents of node {listed} have not restarted their workers yet"
    if timeline.rendezvous_at is None:
        return "rendezvous: rank 0 has not joined its process group yet (the records of rank 0 say so)"
    return "first step: rank 0 has not finished its first training step yet"
