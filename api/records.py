"""The metrics-record format of rank 0, its one parser and its one fold into progress.

Records are one JSON object per line, on rank 0's stdout and appended to
`<checkpoint dir>/metrics.jsonl` (the trainer writes them: `kubetrain.runtime.worker.metrics`).
The local runner, `kubetrain plot` and the operator's progress all read them through
`parse_record`, so their shape is fixed (see EVENTS and docs/trainer.md).

The trainer's rank 0 prints one JSON object per line (`{"event": "step", "time": ...,
"step": ..., "loss": ...}`) between ordinary log lines. The operator reads the last lines of
rank 0's container log (`pods/log`, read-only) while the job runs and folds the newest
records into `status.progress` and `status.lastCheckpoint`. Training pods therefore need no
Kubernetes credentials at all.

Besides the training records, three mark an attempt's start-up and end (see `fold_timeline` and
`gang_failure`); they carry `attempt` and no step, so they never move progress:
* `rendezvous` (the trainer's rank 0, once its process group exists);
* `launch` (each node's torchrun agent when it started its workers, runtime/agent/inplace.py);
* `failure` (each node's torchrun agent once the gang stopped: the gang's first failure, with the
  node, process rank, exit code, reason and message the operator records in status.failures[]).

`fallback` (a torchrun agent, kubetrain.runtime.torch_private): this torch lacks a private name a
feature of kubetrain's runtime needs, and torch's own behaviour runs instead (`feature`, `torch`,
`missing`, `message`). Like the marks it moves no progress; `fold_fallbacks` keeps one per feature
in status.runtimeFallbacks.

`checkpoint_refused` (rank 0, checkpoint.objectStore) says the object store refused a commit: its
`refused_attempt` is stale and `current_attempt` holds the store. It is the job's record, not a mark, but
it moves no progress (a stale attempt's step is not the job's): `fold_refusal` keeps the newest
in status.lastCheckpointRefusal.

`checkpoint_skipped` (rank 0, checkpoint.objectStore) says a resume walked back past a commit whose
payload was missing or did not match (`path`, `why`); it moves no progress either: `fold_skip`
keeps the newest in status.lastCheckpointSkipped, and the operator posts a CheckpointSkipped Event.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubetrain.api.models import (
    MAX_FALLBACKS_KEPT,
    CheckpointRefusal,
    CheckpointSkip,
    LastCheckpoint,
    Progress,
    RuntimeFallback,
    Timeline,
)
from kubetrain.api.record_format import EVENTS as EVENTS
from kubetrain.api.record_format import FALLBACK as FALLBACK
from kubetrain.api.record_format import MARKS as MARKS
from kubetrain.api.record_format import METRICS_FILE as METRICS_FILE
from kubetrain.api.record_format import REFUSED as REFUSED
from kubetrain.api.record_format import SKIPPED as SKIPPED


def parse_record(line: str) -> dict[str, Any] | None:
    """The metrics record on `line`, or None for any other line (a log line, a line cut short
    by a killed process)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if isinstance(record, dict) and record.get("event") in EVENTS:
        return record
    return None


# Records the torchrun agents print (runtime/agent/inplace.py): kubetrain's own plumbing, on node 0's
# output beside rank 0's, not the job's metrics.
AGENT_EVENTS = ("launch", "failure", FALLBACK, "standby")


def records_in(text: str) -> list[dict[str, Any]]:
    return [record for line in text.splitlines() if (record := parse_record(line)) is not None]


def metrics_in(text: str) -> list[dict[str, Any]]:
    """The job's own metrics records in `text`: every record but the marks of an attempt's
    start-up and end (rank 0's rendezvous, the agents' launch and failure) and the runtime's fallbacks."""
    return [record for record in records_in(text) if record["event"] not in MARKS]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number >= 0 else None


def _time(value: Any) -> datetime | None:
    number = _number(value)
    return datetime.fromtimestamp(number, UTC).replace(microsecond=0) if number is not None else None


def _precise_time(value: Any) -> datetime | None:
    """To the millisecond: the timeline's phases are often shorter than a second."""
    number = _number(value)
    if number is None:
        return None
    return datetime.fromtimestamp(round(number, 3), UTC)


def _mark_done(record: dict[str, Any], progress: Progress | None, update: dict[str, Any]) -> None:
    """`doneAt` marks a finished training loop until a new run starts: a `start` record, or
    any record at an earlier step than the done one (a script that logs no `start`)."""
    if record["event"] == "done":
        if (done := _time(record.get("time"))) is not None:
            update["done_at"] = done
    elif progress is not None and progress.done_at is not None:
        done_step = progress.step or 0
        if record["event"] == "start" or update.get("step", done_step) < done_step:
            update["done_at"] = None


def _checkpoint(record: dict[str, Any], checkpoint: LastCheckpoint | None) -> LastCheckpoint | None:
    """`checkpoint` after a `checkpoint` or `resume` record: replaced only by one not older."""
    path, step = record.get("path"), _count(record.get("step"))
    if not (isinstance(path, str) and path and step is not None and (checkpoint is None or step >= checkpoint.step)):
        return checkpoint
    reason = record.get("reason")
    if not isinstance(reason, str) or not reason:
        # A resume of the checkpoint already known keeps what that one said.
        same = checkpoint is not None and checkpoint.path == path[:1024]
        reason = checkpoint.reason if same and checkpoint is not None else None
    return LastCheckpoint(
        path=path[:1024], step=step, time=_time(record.get("time")), reason=reason[:64] if reason else None
    )


def fold_checkpoints(text: str, previous: LastCheckpoint | None) -> LastCheckpoint | None:
    """Only the `checkpoint` records of `text` folded into `previous`: for the log of a pod of an
    attempt that has ended (its archived tail), which may hold a checkpoint written on SIGTERM
    after the operator's last read, but whose progress must never move the job's back."""
    checkpoint = previous
    for record in records_in(text):
        if record["event"] == "checkpoint":
            checkpoint = _checkpoint(record, checkpoint)
    return checkpoint


def _refusal(record: dict[str, Any]) -> CheckpointRefusal | None:
    # `attempt` of every record is the attempt that logged it (the holder's rank 0 reports the
    # refusals it finds); the stale attempt is `refused_attempt`.
    attempt, step, path = _count(record.get("refused_attempt")), _count(record.get("step")), record.get("path")
    if attempt is None or step is None or not isinstance(path, str) or not path:
        return None
    return CheckpointRefusal(
        attempt=attempt,
        current_attempt=_count(record.get("current_attempt")),
        step=step,
        path=path[:1024],
        time=_time(record.get("time")),
    )


def _not_older(found: CheckpointRefusal, previous: CheckpointRefusal | None) -> bool:
    """By time, then step (two refusals within one second: the later one is of a later step)."""
    if previous is None or found.time is None or previous.time is None:
        return True
    return (found.time, found.step) >= (previous.time, previous.step)


def _fallback(record: dict[str, Any]) -> RuntimeFallback | None:
    feature = record.get("feature")
    if not isinstance(feature, str) or not feature:
        return None
    return RuntimeFallback(
        feature=feature[:64],
        torch=str(record.get("torch") or "")[:64],
        message=str(record.get("message") or "")[:1024],
        time=_time(record.get("time")),
    )


def fold_fallbacks(text: str, previous: list[RuntimeFallback] | None) -> list[RuntimeFallback] | None:
    """`previous` and each feature's first `fallback` record in `text` it does not hold yet."""
    kept = list(previous or [])
    held = {fallback.feature for fallback in kept}
    for record in records_in(text):
        if record["event"] == FALLBACK and (found := _fallback(record)) is not None and found.feature not in held:
            held.add(found.feature)
            kept.append(found)
    return kept[:MAX_FALLBACKS_KEPT] if len(kept) > len(previous or []) else previous


def fold_refusal(text: str, previous: CheckpointRefusal | None) -> CheckpointRefusal | None:
    """The newest `checkpoint_refused` record of `text`, or `previous` when `text` has none newer:
    a log read again, or an older refusal found later (an archived log), changes nothing."""
    refusal = previous
    for record in records_in(text):
        if record["event"] != REFUSED or (found := _refusal(record)) is None:
            continue
        if _not_older(found, refusal):
            refusal = found
    return refusal


def fold_skip(text: str, previous: CheckpointSkip | None) -> CheckpointSkip | None:
    """The newest `checkpoint_skipped` record of `text`, or `previous` when `text` has none newer."""
    skip = previous
    for record in records_in(text):
        step, path = _count(record.get("step")), record.get("path")
        if record["event"] != SKIPPED or step is None or not isinstance(path, str) or not path:
            continue
        found = CheckpointSkip(
            attempt=_count(record.get("attempt")),
            step=step,
            path=path[:1024],
            why=str(record.get("why") or "")[:1024],
            time=_time(record.get("time")),
        )
        if (
            skip is None
            or found.time is None
            or skip.time is None
            or (found.time, found.step) >= (skip.time, skip.step)
        ):
            skip = found
    return skip


def fold(
    text: str, previous: Progress | None = None, previous_checkpoint: LastCheckpoint | None = None
) -> tuple[Progress | None, LastCheckpoint | None]:
    """Fold the metrics records found in `text` into the previous progress and checkpoint.

    Fields a record does not carry keep their previous value (an eval line does not erase
    the loss); a checkpoint replaces the last one only if it is not older.
    """
    progress = previous.model_copy() if previous is not None else None
    checkpoint = previous_checkpoint
    for record in records_in(text):
        if record["event"] in (*MARKS, REFUSED, SKIPPED):
            continue
        update: dict[str, Any] = {}
        for key, target in (("epoch", "epoch"), ("step", "step"), ("total_steps", "total_steps")):
            if (count := _count(record.get(key))) is not None:
                update[target] = count
        if (updated := _time(record.get("time"))) is not None:
            update["updated_at"] = updated
        event = record["event"]
        _mark_done(record, progress, update)
        if event in ("step", "done") and (loss := _number(record.get("loss"))) is not None:
            update["loss"] = loss
        if event == "step":
            if (rate := _number(record.get("samples_per_s"))) is not None and rate >= 0:
                update["samples_per_second"] = rate
        elif event == "eval":
            if (accuracy := _number(record.get("accuracy"))) is not None and 0 <= accuracy <= 1:
                update["accuracy"] = accuracy
        elif event in ("checkpoint", "resume"):
            checkpoint = _checkpoint(record, checkpoint)
        if not update:
            continue
        merged = (progress.model_dump() if progress is not None else {}) | update
        if event == "done" and merged.get("total_steps") is not None:
            merged["step"] = max(merged.get("step") or 0, merged["total_steps"])
        step, total = merged.get("step"), merged.get("total_steps")
        if step is not None and total:
            merged["percent"] = min(100, int(100 * step / total))
        progress = Progress.model_validate(merged)
    return progress, checkpoint


def _of_attempt(record: dict[str, Any], timeline: Timeline, since: datetime | None) -> bool:
    """Whether a record belongs to the timeline's attempt: by its `attempt` when it carries one
    (kubetrain's trainer and agent do), else by its time (a script's own records)."""
    attempt = _count(record.get("attempt"))
    if attempt is not None:
        return attempt == timeline.attempt
    when = _precise_time(record.get("time"))
    return when is not None and since is not None and when >= since


# Timeline fields set by the first record of each kind in the attempt (`launch`: node 0's agent).
_MILESTONES = {"launch": "workers_started_at", "rendezvous": "rendezvous_at", "step": "first_step_at"}


def fold_timeline(text: str, timeline: Timeline | None) -> Timeline | None:
    """The timeline with the attempt's first `launch` (of node 0), `rendezvous` and `step` records
    found in `text`. Records without an attempt count from the attempt's start (the restart's
    decision, else its pods' creation)."""
    if timeline is None:
        return None
    since = timeline.detected_at or timeline.pods_created_at
    update: dict[str, Any] = {}
    for record in records_in(text):
        field = _MILESTONES.get(record["event"])
        if field is None or getattr(timeline, field) is not None or field in update:
            continue
        if record["event"] == "launch" and _count(record.get("node")) not in (0, None):
            continue
        when = _precise_time(record.get("time"))
        if when is not None and _of_attempt(record, timeline, since):
            update[field] = when
    return timeline.model_copy(update=update) if update else timeline


@dataclass(frozen=True)
class GangFailure:
    """What a `failure` record says: the first failure of the attempt's gang, as a torchrun agent
    saw it (the node, the process rank on it, how it exited)."""

    attempt: int
    node: int
    rank: int | None
    exit_code: int | None
    reason: str
    message: str
    time: datetime


def gang_failure(text: str, attempt: int) -> GangFailure | None:
    """The newest `failure` record of `attempt` in `text`."""
    found = None
    for record in records_in(text):
        if record["event"] != "failure" or _count(record.get("attempt")) != attempt:
            continue
        node, when = _count(record.get("node")), _precise_time(record.get("time"))
        if node is None or when is None:
            continue
        code = record.get("exit_code")
        reason = record.get("reason")
        message = record.get("message")
        found = GangFailure(
            attempt=attempt,
            node=node,
            rank=_count(record.get("rank")),
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            reason=reason if isinstance(reason, str) and reason else "Error",
            message=message if isinstance(message, str) else "",
            time=when,
        )
    return found
