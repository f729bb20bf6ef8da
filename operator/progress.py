"""Pure: when rank 0's log is due to be read, and folding what it says into the status.

While a job runs the controller reads the tail of rank 0's log at most every progress
interval (`pods/log`, read-only: the pods need no credentials) and once more on the pass
that finishes the job, so the final step and checkpoint are recorded. The metrics records
are folded by `kubetrain.api.records.fold`, the one fold the local runner uses too.

Until the attempt's first step the interval is STARTUP_READ_S: its timeline (api/records.py
`fold_timeline`: rendezvous, first step) and waitingOn then follow the start-up closely.

Two reads cannot wait for the interval. Before the controller acts on a gang failure it reads
rank 0's log and decides again (`recheck`): a trainer that crashes at teardown does so
seconds after rank 0 wrote `done` and its final checkpoint, almost always after the last
periodic read; without the fresh records the late-crash rule (`failures.completed`) could
not see that the work is saved, and the whole gang would run again. And with the in-place
restart, a pod that turns NotReady while its attempt runs holds a failed gang: its torchrun
agent printed a `failure` record, which the controller reads from that pod's log
(`held_suspect`) before deciding.

A `checkpoint_refused` record (a stale attempt's commit to the object store, refused) becomes
status.lastCheckpointRefusal wherever rank 0's records are folded, a current pod's log or an
ended one's archived tail, and each new one a CheckpointRefused Warning Event (`refusal_events`:
the stored status against the one written, so a log read again posts nothing twice). A
`fallback` record (a torchrun agent's: this job's torch lacks a private name a feature of
kubetrain's runtime needs, kubetrain.runtime.torch_private) becomes an entry of
status.runtimeFallbacks, one per feature, and a RuntimeFallback Warning Event, the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kubetrain.api import records
from kubetrain.api.models import CheckpointRefusal, CheckpointSkip, TrainingJobStatus
from kubetrain.api.records import GangFailure
from kubetrain.operator.decision import Event
from kubetrain.operator.failures import completed
from kubetrain.operator.pods import PodView

READ_IN = ("Running", "Restarting")
# How often rank 0's log is read while the attempt has not finished its first step.
STARTUP_READ_S = 1.0


def due(
    previous: TrainingJobStatus | None,
    status: TrainingJobStatus,
    pods: Sequence[PodView],
    since_read: float | None,
    interval: float,
) -> tuple[str | None, float | None]:
    """Rank 0's pod if its log is due now (else None), and when to look again (None: not while
    the job is in this state). `previous` is the status before this pass, `status` the one
    decided; `since_read` the seconds since the last read of this job (None: never)."""
    finishing = status.completion_time is not None and (previous is None or previous.completion_time is None)
    if status.phase not in READ_IN and not finishing:
        return None, None
    line = status.timeline
    if line is not None and line.attempt == status.attempt and line.first_step_at is None:
        interval = min(interval, STARTUP_READ_S)
    if not finishing and since_read is not None and since_read < interval:
        return None, interval - since_read
    return rank0(pods), interval


def rank0(pods: Sequence[PodView]) -> str | None:
    """Rank 0's pod if it has a log to read: started, and not being deleted."""
    return next((p.name for p in pods if p.rank == 0 and p.phase != "Pending" and not p.terminating), None)


def held_suspect(status: TrainingJobStatus | None, pods: Sequence[PodView]) -> str | None:
    """A pod of the current attempt whose torchrun agent may hold a failed gang: Running, and
    turned NotReady after its container started and after the attempt began (an in-place attempt
    begins when it is decided; its pods turned NotReady before, to hold the previous one). Node
    0's first: every agent prints the gang's record."""
    if status is None:
        return None
    line = status.timeline
    began = (
        line.detected_at if line is not None and line.attempt == status.attempt and line.start == "InPlace" else None
    )
    suspects = [
        p
        for p in pods
        if p.attempt == status.attempt
        and p.phase == "Running"
        and not p.ready
        and not p.terminating
        and p.ready_at is not None
        and p.started is not None
        and p.ready_at > p.started
        and (began is None or p.ready_at > began)
    ]
    return min(suspects, key=lambda p: p.rank or 0).name if suspects else None


def holding(pods: Sequence[PodView], held: GangFailure | None) -> list[PodView]:
    """The pods with the gang failure their agents reported attached to the blamed node's pod
    (to any pod of that attempt when the blamed one is not there)."""
    if held is None:
        return list(pods)
    mine = [p for p in pods if p.attempt == held.attempt and not p.terminating]
    target = next((p for p in mine if p.rank == held.node), mine[0] if mine else None)
    return [replace(p, held=held) if p is target else p for p in pods]


def recheck(previous: TrainingJobStatus | None, decided: TrainingJobStatus) -> bool:
    """Whether to read rank 0's log and decide again before acting: `decided` records a new gang
    failure (a restart or a failed job follows) while the stored status does not show the work
    complete."""
    before = previous or TrainingJobStatus()
    return (decided.failures or [])[-1:] != (before.failures or [])[-1:] and completed(before) is None


def fold(status: TrainingJobStatus, text: str) -> TrainingJobStatus:
    """`status` with the metrics records found in `text` folded into progress, lastCheckpoint,
    lastCheckpointRefusal, runtimeFallbacks and the current attempt's timeline."""
    progress, checkpoint = records.fold(text, status.progress, status.last_checkpoint)
    line = status.timeline
    if line is not None and line.attempt == status.attempt:
        line = records.fold_timeline(text, line)
    update = {
        "progress": progress,
        "last_checkpoint": checkpoint,
        "timeline": line,
        "last_checkpoint_refusal": records.fold_refusal(text, status.last_checkpoint_refusal),
        "last_checkpoint_skipped": records.fold_skip(text, status.last_checkpoint_skipped),
        "runtime_fallbacks": records.fold_fallbacks(text, status.runtime_fallbacks),
    }
    return status.model_copy(update=update)


def fold_checkpoints(status: TrainingJobStatus, text: str) -> TrainingJobStatus:
    """`status` with only the checkpoint records of `text` folded into lastCheckpoint and
    lastCheckpointRefusal: `text` is the archived log of an ended pod (operator/archive.py), whose
    progress is not the job's (a stale attempt's refused commit is most often found there)."""
    checkpoint = records.fold_checkpoints(text, status.last_checkpoint)
    refusal = records.fold_refusal(text, status.last_checkpoint_refusal)
    if (checkpoint, refusal) == (status.last_checkpoint, status.last_checkpoint_refusal):
        return status
    return status.model_copy(update={"last_checkpoint": checkpoint, "last_checkpoint_refusal": refusal})


REFUSAL_EVENT = "CheckpointRefused"


def refusal_event(previous: CheckpointRefusal | None, refusal: CheckpointRefusal | None) -> Event | None:
    """The Warning Event of a refusal `previous` (the one stored, or shown) does not hold yet."""
    if refusal is None or refusal == previous:
        return None
    holder = "a newer attempt" if refusal.current_attempt is None else f"attempt {refusal.current_attempt}"
    message = (
        f"attempt {refusal.attempt}'s checkpoint of step {refusal.step} ({refusal.path}) was refused: "
        f"{holder} holds the object store, and a stale attempt's commit never overwrites it"
    )
    return Event("Warning", REFUSAL_EVENT, message)


def refusal_events(previous: TrainingJobStatus, status: TrainingJobStatus) -> list[Event]:
    """What the controller posts beside writing `status` over the stored `previous`: a refused
    commit, a skipped one."""
    events = [refusal_event(previous.last_checkpoint_refusal, status.last_checkpoint_refusal)]
    events.append(skip_event(previous.last_checkpoint_skipped, status.last_checkpoint_skipped))
    return [event for event in events if event is not None]


SKIP_EVENT = "CheckpointSkipped"


def skip_event(previous: CheckpointSkip | None, skip: CheckpointSkip | None) -> Event | None:
    """The Warning Event of a skipped commit `previous` (the one stored, or shown) does not hold yet."""
    if skip is None or skip == previous:
        return None
    who = f"attempt {skip.attempt}" if skip.attempt is not None else "the resume"
    message = f"{who} skipped the checkpoint of step {skip.step} ({skip.path}) and resumed an older one: {skip.why}"
    return Event("Warning", SKIP_EVENT, message[:1024])


FALLBACK_EVENT = "RuntimeFallback"


def fallback_events(previous: TrainingJobStatus, status: TrainingJobStatus) -> list[Event]:
    """A Warning Event for each runtime fallback `status` holds and the stored `previous` does not."""
    held = {fallback.feature for fallback in previous.runtime_fallbacks or []}
    return [
        Event("Warning", FALLBACK_EVENT, f.message) for f in status.runtime_fallbacks or [] if f.feature not in held
    ]
