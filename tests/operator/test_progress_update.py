"""The progress step of a reconcile with an injected log source (no kubelet serves logs here)."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.operator.handlers import Operator
from kubetrain.operator.settings import OperatorSettings
from kubetrain.operator.status import Decision, PodView

LOG = "\n".join(
    json.dumps({"event": "step", "time": 1.7e9, "step": s, "epoch": 0, "total_steps": 100, "loss": 1.0 / s})
    for s in (10, 20)
)


def job() -> TrainingJob:
    return TrainingJob.model_validate(
        {"apiVersion": "kubetrain.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j"}, "spec": {"nodes": 2}}
    )


def view(rank: int, phase: str) -> PodView:
    return PodView(f"j-node-{rank}", f"u{rank}", "uid", rank, 0, phase, False, datetime.now(UTC))


def run(source: Any, phase: str = "Running", pods: list[PodView] | None = None) -> tuple[Decision, list[str]]:
    calls: list[str] = []

    async def logs(namespace: str, pod: str) -> str:
        calls.append(pod)
        return await source(namespace, pod)

    operator = Operator(settings=OperatorSettings(progress_interval_seconds=5), kube=None, log_source=logs)  # type: ignore[arg-type]
    decision = Decision(status=TrainingJobStatus(phase=phase))  # type: ignore[arg-type]
    pods = pods if pods is not None else [view(0, "Running"), view(1, "Running")]

    async def twice() -> None:
        await operator._progress(("ns", "j"), job(), decision, pods)
        await operator._progress(("ns", "j"), job(), decision, pods)  # within the interval: no second read

    asyncio.run(twice())
    return decision, calls


def test_rank_zero_log_fills_progress_once_per_interval() -> None:
    async def source(namespace: str, pod: str) -> str:
        return LOG

    decision, calls = run(source)
    assert calls == ["j-node-0"]
    progress = decision.status.progress
    assert progress is not None and progress.step == 20 and progress.percent == 20 and progress.loss == 0.05
    assert decision.requeue_after == 5


def test_log_read_failure_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    async def source(namespace: str, pod: str) -> str:
        raise ConnectionError("no kubelet")

    with caplog.at_level(logging.DEBUG, logger="kubetrain.operator"):
        decision, calls = run(source)
    assert calls == ["j-node-0"] and decision.status.progress is None
    # Only at debug: a pod without a kubelet yet, or a rotated log, is routine.
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_not_read_while_pending_or_before_rank_zero_starts() -> None:
    async def source(namespace: str, pod: str) -> str:
        return LOG

    assert run(source, phase="Pending")[1] == []
    assert run(source, pods=[view(0, "Pending"), view(1, "Running")])[1] == []
