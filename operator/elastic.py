"""Elastic gangs (spec.elastic): which nodes train in an attempt, and when the gang changes size.

The rules, and the stages of `status.decide` that apply them to its pass (operator/decide_pass.py);
pure, as decide is. docs/elastic.md repeats the rules.

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

from kubetrain.api.models import (
    MAX_RESIZES_KEPT,
    ReplicaCounts,
    Resize,
    StandbyFailure,
    TrainingJobSpec,
    TrainingJobStatus,
)
from kubetrain.operator import timeline
from kubetrain.operator.decide_pass import Pass, Problem
from kubetrain.operator.decision import Event
from kubetrain.operator.failures import describe, failure_of
from kubetrain.operator.pods import TERMINAL_PHASES, PodView

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
    return f"{spec.min_nodes}-{spec.nodes}"


def first_gang(spec: TrainingJobSpec, ready: Sequence[PodView], waiting: Sequence[PodView]) -> list[int] | None:
    """The ranks of the first gang of a job with no member yet (or below its minimum), or None to
    wait: at least minNodes standby pods Ready, and no other pod that runs (only pods waiting for
    a node, whose capacity may never come, are left out)."""
    assert spec.elastic is not None
    if len(ready) < spec.min_nodes or any(p.phase == "Running" for p in waiting):
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


# --- the stages of status.decide ----------------------------------------------------------


def split_members(run: Pass) -> None:
    """The attempt's gang (run.current) and its pods on standby; an elastic job starts with none."""
    spec, status = run.job.spec, run.status
    if spec.elastic is not None and status.members is None:
        status.members, status.size = [], 0
    run.members = members(spec, status)
    gang = set(run.members)
    run.standby = [p for p in run.current if p.rank not in gang]
    run.current = [p for p in run.current if p.rank in gang]


def reform(run: Pass) -> None:
    """A gang recreated or resumed: an elastic one forms again from the pods that can run."""
    if run.job.spec.elastic is not None:
        run.status.members, run.status.size = [], 0
        run.members = []


def shrink(run: Pass, problem: Problem) -> bool:
    """A member's pod lost while node 0's lives: the rest train on in place (or wait, below the
    minimum), counted against no budget. Whether it shrank: decide then moves the pods to the new
    attempt in place and converges, as after a grow."""
    spec, attempt = run.job.spec, run.status.attempt
    if spec.elastic is None or not run.members:
        return False
    gone = [p for p in run.ours if p.rank in run.members and p.attempt == attempt and p.terminating]
    gone += [p for p in run.current if p.phase in TERMINAL_PHASES] + run.vanished([])
    lost = {p.rank for p in gone if p.rank is not None}
    if not lost or run.members[0] in lost or any(p.phase == "Succeeded" for p in run.current):
        return False  # node 0's pod hosts the gang's store; a finishing gang is judged as usual
    failure, _ = problem
    remaining = [r for r in run.members if r not in lost]
    below = len(remaining) < spec.min_nodes
    after = [] if below else remaining
    before = run.members
    status = run.status
    status.attempt += 1
    why = f"{failure.reason}: {failure.message}" if failure.message else failure.reason
    message = (
        f"node{'s' if len(lost) > 1 else ''} {describe_nodes(sorted(lost))} lost ({why[:600]}); "
        + (
            f"{len(remaining)} node(s) remain, fewer than elastic.minNodes {spec.min_nodes}: attempt "
            f"{status.attempt} waits for capacity"
            if below
            else f"the gang trains on at {len(after)} of {range_text(spec)} nodes as attempt {status.attempt}"
        )
        + " (not counted against maxRestarts)"
    )
    record(status, before, after, f"{LOST} ({failure.reason})", message, run.now)
    run.members = after
    run.decision.events.append(Event("Warning", "Resized", message))
    run.decision.commit_first = True
    _below_minimum(run, below, message)
    status.replicas = ReplicaCounts()
    status.timeline = timeline.begin(status.attempt, "InPlace", failed_at=failure.time, detected_at=run.precise)
    if below:  # nothing restarts: the job waits for capacity (phase Pending, BelowMinNodes)
        run.condition("Running", False, "Resizing", message, only_if_present=True)
    else:
        _resizing(run, message)
    return True


def grow(run: Pass) -> bool:
    """Standby pods Ready: the gang forms (no member yet, or below the minimum) or grows (once the
    cool-down since the last resize passed, while it trains), in place at the next attempt.
    Whether it did: decide then moves the pods in place and converges, as after a shrink."""
    spec, status = run.job.spec, run.status
    if spec.elastic is None:
        return False
    ready = [p for p in run.standby if p.ready and p.phase == "Running"]
    if not run.members:
        gang = first_gang(spec, ready, [p for p in run.standby if p not in ready])
        if gang is None or 0 not in gang:
            return False
        reason, joined = FORMED if not status.resizes else GROWN, gang
    else:
        line = status.timeline
        if not ready or line is None or line.attempt != status.attempt or line.first_step_at is None:
            return False  # nothing to add, or the gang has not trained yet at its size
        due = cooldown_due(spec, status)
        if due is not None and run.now < due:
            run.decision.requeue((due - run.now).total_seconds())
            return False
        joined = sorted([*run.members, *(p.rank for p in ready if p.rank is not None)])
        reason = GROWN
    before = run.members
    status.attempt += 1
    added = sorted(set(joined) - set(before))
    message = (
        f"node{'s' if len(added) > 1 else ''} {describe_nodes(added)} can run: the gang trains at "
        f"{len(joined)} of {range_text(spec)} nodes as attempt {status.attempt}"
    )
    record(status, before, joined, reason, message, run.now)
    run.members = joined
    run.decision.events.append(Event("Normal", "Resized", message))
    run.decision.commit_first = True
    _below_minimum(run, False, message)
    if before:  # a gang that grows; one that forms starts, as a job's first gang does
        _resizing(run, message)
    status.replicas = ReplicaCounts()
    status.timeline = timeline.begin(status.attempt, "InPlace", detected_at=run.precise)
    return True


def limit_creation(run: Pass, failed_standby: list[PodView]) -> None:
    """Of the ranks decide would create (decision.create_ranks), an elastic job's that may be created
    now: not a node whose standby pod failed within its back-off, its first ranks before the others,
    and none beyond Kueue's admitted count."""
    decision = run.decision
    _back_off_standby(run, failed_standby)
    first = _first_ranks(run)
    if not _placed(run, first):
        # Node 0's pod hosts the gang's store and is in every gang: it takes the first
        # capacity there is (with the rest of the gang's quorum), the others come once it has a node.
        decision.create_ranks = [r for r in decision.create_ranks if r in first]
    if run.admitted is not None:  # Kueue's partial admission: no pod beyond the quota it gave
        decision.create_ranks = [r for r in decision.create_ranks if r < run.admitted]


def standby_text(run: Pass) -> str:
    """What a job with no gang (forming, or below its minimum) waits for."""
    spec = run.job.spec
    ready = sorted(p.rank for p in run.standby if p.ready and p.rank is not None)
    text = (
        f"waiting for nodes: {len(ready)} of {spec.nodes} pods ready to train "
        f"(node 0 and at least {spec.min_nodes} needed)"
    )
    if run.admitted is not None and run.admitted < spec.nodes:
        text += f"; Kueue admitted {run.admitted} of them"
    return text


def _resizing(run: Pass, message: str) -> None:
    """A gang that trains on at another size restarts in place: phase Restarting (reason
    Resizing) until its pods run the new attempt, as after any in-place restart."""
    run.condition("Restarting", True, "Resizing", message)
    run.condition("Running", False, "Resizing", message, only_if_present=True)


def _below_minimum(run: Pass, below: bool, message: str) -> None:
    if below:
        if run.condition(CONDITION, True, "WaitingForNodes", message):
            run.decision.events.append(Event("Warning", CONDITION, message))
    else:
        run.condition(CONDITION, False, "EnoughNodes", message, only_if_present=True)


def _back_off_standby(run: Pass, failed: list[PodView]) -> None:
    """Each failed standby pod counted once and announced; a node whose pod failed on standby is
    created again only once its back-off passed (standby_backoff), and the gang's members start
    afresh."""
    status, decision = run.status, run.decision
    forget_standby_failures(status, run.members)
    for pod in failed:
        assert pod.rank is not None  # standby pods are the attempt's, found by rank
        why = describe(failure_of(pod, status.attempt, "failed", run.now))
        entry = count_standby_failure(status, pod.rank, pod.uid, why, run.now)
        if entry is not None:
            wait = standby_backoff(entry.count).total_seconds()
            message = f"{why}, on standby; created again in {wait:.0f} s (failure {entry.count} in a row)"
            decision.events.append(Event("Warning", STANDBY_FAILED, message[:1024]))
    held = {r: due for r in decision.create_ranks if (due := standby_due(status, r)) and due > run.now}
    decision.create_ranks = [r for r in decision.create_ranks if r not in held]
    if held:
        decision.requeue((min(held.values()) - run.now).total_seconds())


def _first_ranks(run: Pass) -> list[int]:
    """The ranks an elastic job places before its others: node 0, whose agent hosts the gang's
    store; with a PodGroup the first minNodes, which kube-scheduler places together (node 0 is
    then in the quorum, never left waiting behind pods that took the capacity)."""
    grouped = run.decision.gang_mode != "none"
    return list(range(run.job.spec.min_nodes)) if grouped else [0]


def _placed(run: Pass, ranks: list[int]) -> bool:
    pods = {p.rank: p for p in [*run.current, *run.standby]}
    return all(r in pods and (pods[r].scheduled or pods[r].phase != "Pending") for r in ranks)
