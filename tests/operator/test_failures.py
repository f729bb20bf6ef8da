"""The failure policy's matching and the late-crash rule's inputs, as pure functions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from kubetrain.api.models import Failure, FailurePolicy, TrainingJobStatus
from kubetrain.api.records import fold
from kubetrain.operator.failures import completed, describe_rule, judge
from kubetrain.operator.pods import PodCondition

pytestmark = pytest.mark.unit

DISRUPTED = (PodCondition("DisruptionTarget", "True", "EvictionByEvictionAPI"),)


def policy(*rules: dict[str, Any]) -> FailurePolicy:
    return FailurePolicy.model_validate({"rules": list(rules)})


def failure(exit_code: int | None = 1, reason: str = "Error") -> Failure:
    return Failure(attempt=0, rank=0, pod="j-node-0", exit_code=exit_code, reason=reason)


@pytest.mark.parametrize(
    ("rules", "failed", "conditions", "action", "rule"),
    [
        ([], failure(), (), "RestartJob", None),
        (
            [],
            failure(None, "EvictionByEvictionAPI"),
            DISRUPTED,
            "RestartJobAndIgnoreMaxRestarts",
            "the default failure policy (RestartJobAndIgnoreMaxRestarts on pod condition DisruptionTarget)",
        ),
        (
            [],
            failure(None, "NodeLost"),
            (),
            "RestartJobAndIgnoreMaxRestarts",
            "the default failure policy (RestartJobAndIgnoreMaxRestarts on reason Evicted or Preempted or NodeLost "
            "or Terminated or PodDeleted)",
        ),
        # Kubernetes' semantics: no exit code matches neither operator; 0 never matches NotIn.
        (
            [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [1]}}],
            failure(None),
            (),
            "RestartJob",
            None,
        ),
        (
            [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [1]}}],
            failure(0),
            (),
            "RestartJob",
            None,
        ),
        (
            [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2, 3]}}],
            failure(3),
            (),
            "FailJob",
            "failurePolicy.rules[0] (FailJob on exit codes 2, 3)",
        ),
        (
            [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0, 137]}}],
            failure(1),
            (),
            "FailJob",
            "failurePolicy.rules[0] (FailJob on exit code not in 0, 137)",
        ),
        (
            [
                {"action": "FailJob", "onFailureReasons": ["OOMKilled"]},
                {"action": "RestartJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "False"}]},
            ],
            failure(),
            (PodCondition("DisruptionTarget", "False"),),
            "RestartJob",
            "failurePolicy.rules[1] (RestartJob on pod condition DisruptionTarget=False)",
        ),
    ],
)
def test_judge(
    rules: list[dict[str, Any]],
    failed: Failure,
    conditions: tuple[PodCondition, ...],
    action: str,
    rule: str | None,
) -> None:
    verdict = judge(policy(*rules), failed, conditions)
    assert (verdict.action, verdict.rule) == (action, rule)


def test_rules_describe_themselves_for_messages() -> None:
    rule = policy({"action": "RestartJobAndIgnoreMaxRestarts", "onFailureReasons": ["Stalled", "OOMKilled"]}).rules[0]
    assert describe_rule(rule) == "RestartJobAndIgnoreMaxRestarts on reason Stalled or OOMKilled"


def record(event: str, step: int, **fields: Any) -> str:
    return json.dumps({"event": event, "time": 1_700_000_000 + step, "step": step, "total_steps": 100, **fields})


FINISHED = [
    record("start", 0),
    record("step", 100, loss=0.1),
    record("checkpoint", 100, path="/checkpoints/step-100"),
    record("eval", 100, accuracy=0.9),
    record("done", 100),
]


def status_after(*lines: str) -> TrainingJobStatus:
    """The status after the fold of these records, line by line (as reads of a growing log)."""
    status = TrainingJobStatus()
    for line in lines:
        status.progress, status.last_checkpoint = fold(line, status.progress, status.last_checkpoint)
    return status


@pytest.mark.parametrize(
    ("lines", "complete"),
    [
        (FINISHED, True),
        ([*FINISHED, record("checkpoint", 100, path="/checkpoints/step-100b")], True),
        (FINISHED[:2] + FINISHED[3:], False),  # no checkpoint of the final step
        (FINISHED[:-1], False),  # no done record: the loop did not finish
        ([*FINISHED, record("start", 60, resumed_from="/checkpoints/step-60")], False),  # a new run started
        ([*FINISHED, record("step", 70, loss=0.2)], False),  # a new run that logs no start
    ],
    ids=["done", "checkpoint-after-done", "no-final-checkpoint", "no-done", "new-run", "new-run-without-start"],
)
def test_completed_needs_done_and_the_final_checkpoint(lines: list[str], complete: bool) -> None:
    status = status_after(*lines)
    assert (completed(status) is not None) == complete
    if complete:
        assert status.progress is not None
        assert status.progress.done_at == datetime.fromtimestamp(1_700_000_100, UTC)
