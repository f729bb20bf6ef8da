"""Progress: when rank 0's log is due (progress.due, pure), the fold into the status, and the
controller's read with an injected log source (no kubelet serves logs here)."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from support.jobs import job_model
from support.pods import pod_view

from kubetrain.api.models import TrainingJobStatus
from kubetrain.operator import progress
from kubetrain.operator.decision import Decision
from kubetrain.operator.logs_io import PodLogs, Reads
from kubetrain.operator.pods import PodView

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
LOG = "\n".join(
    json.dumps({"event": "step", "time": 1.7e9, "step": s, "epoch": 0, "total_steps": 100, "loss": 1.0 / s})
    for s in (10, 20)
)


JOB = job_model("j")


def view(rank: int, phase: str, terminating: bool = False) -> PodView:
    return pod_view(JOB, rank, phase=phase, terminating=terminating)


RUNNING = [view(0, "Running"), view(1, "Running")]
NOW_DONE = TrainingJobStatus(phase="Succeeded", completion_time=T0)


@pytest.mark.parametrize(
    ("previous", "status", "pods", "since", "expected"),
    [
        (None, TrainingJobStatus(phase="Running"), RUNNING, None, ("j-node-0", 15)),  # never read
        (None, TrainingJobStatus(phase="Running"), RUNNING, 16.0, ("j-node-0", 15)),
        (None, TrainingJobStatus(phase="Running"), RUNNING, 5.0, (None, 10)),  # due in 10 s
        (None, TrainingJobStatus(phase="Restarting"), RUNNING, None, ("j-node-0", 15)),
        (None, TrainingJobStatus(phase="Pending"), RUNNING, None, (None, None)),
        (None, TrainingJobStatus(phase="Running"), [view(0, "Pending"), view(1, "Running")], None, (None, 15)),
        (None, TrainingJobStatus(phase="Running"), [view(0, "Running", terminating=True)], None, (None, 15)),
        # The pass that finishes the job reads once more, interval or not: the final step.
        (TrainingJobStatus(phase="Running"), NOW_DONE, [view(0, "Succeeded")], 1.0, ("j-node-0", 15)),
        (NOW_DONE, NOW_DONE, [view(0, "Succeeded")], 100.0, (None, None)),  # finished before
    ],
)
def test_due(
    previous: TrainingJobStatus | None,
    status: TrainingJobStatus,
    pods: list[PodView],
    since: float | None,
    expected: tuple[str | None, float | None],
) -> None:
    assert progress.due(previous, status, pods, since, 15.0) == expected


FAILURE = {"attempt": 0, "rank": 1, "pod": "j-node-1", "reason": "Error", "time": T0}
DONE = {"step": 100, "doneAt": T0}
SAVED = {"path": "/ckpt/step-100", "step": 100}


@pytest.mark.parametrize(
    ("stored", "decided", "expected"),
    [
        ({}, {"failures": [FAILURE]}, True),  # a new failure: read before restarting
        ({"failures": [FAILURE]}, {"failures": [FAILURE]}, False),  # recorded before: nothing new
        ({"failures": [FAILURE]}, {"failures": [FAILURE, {**FAILURE, "attempt": 1}]}, True),
        ({}, {}, False),
        # The stored status shows the work complete already: decide applied the late-crash rule.
        ({"progress": DONE, "lastCheckpoint": SAVED}, {"failures": [FAILURE]}, False),
        ({"progress": DONE, "lastCheckpoint": {**SAVED, "step": 90}}, {"failures": [FAILURE]}, True),
    ],
)
def test_recheck(stored: dict[str, Any], decided: dict[str, Any], expected: bool) -> None:
    previous = TrainingJobStatus.model_validate(stored)
    assert progress.recheck(previous, TrainingJobStatus.model_validate(decided)) is expected


def test_fold_keeps_what_a_record_does_not_carry() -> None:
    status = TrainingJobStatus(phase="Running")
    folded = progress.fold(status, "a log line\n" + LOG)
    assert folded is not status and status.progress is None  # a new status; the input is unchanged
    assert folded.progress is not None and (folded.progress.step, folded.progress.loss) == (20, 0.05)
    again = progress.fold(folded, json.dumps({"event": "eval", "time": 1.7e9, "accuracy": 0.5}))
    assert again.progress is not None and (again.progress.loss, again.progress.accuracy) == (0.05, 0.5)


REFUSED = json.dumps(
    {
        "event": "checkpoint_refused",
        "time": 1.7e9,
        "step": 40,
        "epoch": 0,
        "path": "s3://bucket/runs/a/step-40",
        "attempt": 2,
        "refused_attempt": 1,
        "current_attempt": 2,
    }
)


@pytest.mark.parametrize("fold", [progress.fold, progress.fold_checkpoints], ids=["rank-0-log", "archived-log"])
def test_a_refusal_is_one_warning_event_however_often_its_log_is_read(fold: Any) -> None:
    stored = TrainingJobStatus(phase="Running", attempt=2)
    assert progress.refusal_events(stored, fold(stored, LOG)) == []
    folded = fold(stored, LOG + "\n" + REFUSED)
    refusal = folded.last_checkpoint_refusal
    assert refusal is not None and (refusal.attempt, refusal.current_attempt, refusal.step) == (1, 2, 40)
    (event,) = progress.refusal_events(stored, folded)
    assert (event.type, event.reason) == ("Warning", "CheckpointRefused")
    assert event.message == (
        "attempt 1's checkpoint of step 40 (s3://bucket/runs/a/step-40) was refused: attempt 2 holds the "
        "object store, and a stale attempt's commit never overwrites it"
    )
    # The status written holds it: the same log read again is no news.
    assert progress.refusal_events(folded, fold(folded, LOG + "\n" + REFUSED)) == []
    assert folded.wire()["lastCheckpointRefusal"]["currentAttempt"] == 2


def read_twice(source: Any) -> tuple[Decision, list[str]]:
    calls: list[str] = []

    async def logs(namespace: str, pod: str) -> str:
        calls.append(pod)
        return await source(namespace, pod)

    pod_logs = PodLogs(kube=None, tail=200, source=logs)  # type: ignore[arg-type]
    reads = Reads()
    decision = Decision(status=TrainingJobStatus(phase="Running"))

    async def twice() -> None:
        await pod_logs.progress("ns", reads, JOB, decision, RUNNING, interval=5)
        await pod_logs.progress("ns", reads, JOB, decision, RUNNING, interval=5)  # within the interval

    asyncio.run(twice())
    return decision, calls


def test_rank_zero_log_fills_progress_once_per_interval() -> None:
    async def source(namespace: str, pod: str) -> str:
        return LOG

    decision, calls = read_twice(source)
    assert calls == ["j-node-0"]
    status = decision.status.progress
    assert status is not None and status.step == 20 and status.percent == 20 and status.loss == 0.05
    assert decision.requeue_after is not None and 0 < decision.requeue_after <= 5


def test_log_read_failure_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    async def source(namespace: str, pod: str) -> str:
        raise ConnectionError("no kubelet")

    with caplog.at_level(logging.DEBUG, logger="kubetrain.operator"):
        decision, calls = read_twice(source)
    assert calls == ["j-node-0"] and decision.status.progress is None
    # Only at debug: a pod without a kubelet yet, or a rotated log, is routine.
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
