"""The failure policy's matching and the late-crash rule's inputs, as pure functions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from kubetrain.api.contract import unrecoverable
from kubetrain.api.models import Failure, FailurePolicy, TrainingJobStatus
from kubetrain.api.records import GangFailure, fold
from kubetrain.operator.failures import (
    Raised,
    completed,
    describe_rule,
    error_of,
    failure_of,
    held_failure,
    judge,
    repeated_error,
)
from kubetrain.operator.pods import PodCondition, PodView

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


# --- the repeated-error rule ------------------------------------------------------------------

SHIPPED = "/kubetrain/function/function.py"
# A function's failure as the torchrun agent's `failure` record reports it (an in-place restart).
UNREACHABLE = "kubetrain.runtime.worker.dist.MasterUnreachableError"
AGENT_RECORD = f"""worker rank 1 (local rank 0, pid 16462) exited with code 1: ValueError: bad lr
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/kubetrain/runtime/guest/function.py", line 102, in main
    fn(*call.args, **call.kwargs)
  File "{SHIPPED}", line 5, in train
    raise ValueError(message)
ValueError: bad lr"""
# The same failure as a pod's termination message: the end of torchrun's failure summary, which
# quotes the error file the runner wrote (a recreated gang).
SUMMARY = f"""  File "/usr/lib/python3/site-packages/torch/distributed/launcher/api.py", line 386, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
kubetrain.runtime.guest.function FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_21:09:16
  host      : train-node-0
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 16837)
  error_file: /tmp/torchelastic_xyizedgu/none_hngty63a/attempt_0/0/error.json
  traceback : Traceback (most recent call last):
    File "/usr/lib/python3/site-packages/kubetrain/runtime/guest/function.py", line 102, in main
      fn(*call.args, **call.kwargs)
    File "{SHIPPED}", line 5, in train
      raise ValueError(message)
                    ^^^^^^^^^^^
  ValueError: bad lr

============================================================"""
# torchrun's summary of a script that did not record its error: only torchrun's own exception.
UNRECORDED = SUMMARY.split("  traceback :")[0] + "  traceback : To enable traceback see: https://pytorch.org/docs"
BAD_LR = Raised("ValueError: bad lr", f"{SHIPPED}:5")


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (AGENT_RECORD, BAD_LR),
        (SUMMARY, BAD_LR),
        # What a termination message keeps of a long traceback is its end: enough.
        (AGENT_RECORD[AGENT_RECORD.index(f'  File "{SHIPPED}"') :], BAD_LR),
        (
            UNRECORDED,
            Raised(
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
                "/usr/lib/python3/site-packages/torch/distributed/launcher/api.py:386",
            ),
        ),
        ("Traceback\nboom", None),
        ("", None),
        # A frame whose exception line was cut off, or is not one.
        (AGENT_RECORD.rsplit("\n", 1)[0], None),
        (AGENT_RECORD.rsplit("\n", 1)[0] + "\n-- 3 more lines --", None),
    ],
)
def test_error_of_reads_the_last_exception_and_where_it_was_raised(message: str, error: Raised | None) -> None:
    assert error_of(message) == error


def attempt_failed(attempt: int, message: str, rank: int = 0) -> Failure:
    return Failure(attempt=attempt, rank=rank, pod=f"j-node-{rank}", exit_code=1, reason="Error", message=message)


@pytest.mark.parametrize(
    ("previous", "failed", "repeated"),
    [
        # The same error, whichever way it was reported and whichever rank was first.
        (attempt_failed(0, AGENT_RECORD, rank=1), attempt_failed(1, SUMMARY), BAD_LR),
        (attempt_failed(3, SUMMARY), attempt_failed(4, AGENT_RECORD), BAD_LR),
        # Not the attempt before (an uncounted disruption, or a suspension, came between).
        (attempt_failed(0, AGENT_RECORD), attempt_failed(2, AGENT_RECORD), None),
        (None, attempt_failed(1, AGENT_RECORD), None),
        # Another text, another line: a different error.
        (attempt_failed(0, AGENT_RECORD.replace("bad lr", "bad lr 2")), attempt_failed(1, AGENT_RECORD), None),
        (attempt_failed(0, AGENT_RECORD.replace("line 5", "line 6")), attempt_failed(1, AGENT_RECORD), None),
        # A flaky error: a lost peer's message names a port that differs each time.
        (
            attempt_failed(
                0, AGENT_RECORD.replace("ValueError: bad lr", "RuntimeError: Connection closed by peer [10.0.0.7]:4311")
            ),
            attempt_failed(
                1, AGENT_RECORD.replace("ValueError: bad lr", "RuntimeError: Connection closed by peer [10.0.0.7]:5120")
            ),
            None,
        ),
        # Errors of the environment repeat word for word while it lasts: always restarted.
        (
            attempt_failed(
                0, AGENT_RECORD.replace("ValueError: bad lr", "torch.distributed.DistNetworkError: timed out")
            ),
            attempt_failed(
                1, AGENT_RECORD.replace("ValueError: bad lr", "torch.distributed.DistNetworkError: timed out")
            ),
            None,
        ),
        (attempt_failed(0, UNRECORDED), attempt_failed(1, UNRECORDED), None),
        (
            attempt_failed(
                0, AGENT_RECORD.replace("ValueError", "kubetrain.runtime.worker.dist.MasterUnreachableError")
            ),
            attempt_failed(
                1, AGENT_RECORD.replace("ValueError", "kubetrain.runtime.worker.dist.MasterUnreachableError")
            ),
            None,
        ),
        # No traceback: nothing to compare (an OOM kill, a deleted pod).
        (attempt_failed(0, "OOMKilled"), attempt_failed(1, "OOMKilled"), None),
    ],
)
def test_repeated_error_is_the_same_exception_at_the_same_line_in_the_attempt_before(
    previous: Failure | None, failed: Failure, repeated: Raised | None
) -> None:
    assert repeated_error(previous, failed) == repeated


# A failure the trainer marked unrecoverable (api/contract.py) fails the job at once, with its reason
# and one sentence instead of the log's tail; a user's rule, read first, may still restart it.
DENIED = unrecoverable(
    "CheckpointStoreDenied",
    "checkpoint store s3://b/p (endpoint http://s3:8333) refused reading the log: 403 Forbidden",
)
TAIL = f"Traceback (most recent call last):\n  File 'x.py', line 3\nobjectstore.Unrecoverable: {DENIED}\n"


def test_a_marked_pod_failure_takes_the_marks_reason_and_one_sentence_and_fails_the_job() -> None:
    pod = PodView(
        name="j-node-1", uid="u", job_uid="j", rank=1, attempt=0, phase="Failed", terminating=False,
        created=None, exit_code=1, reason="Error", message=TAIL,
    )  # fmt: skip
    failed = failure_of(pod, 0, "failed", datetime(2026, 1, 1, tzinfo=UTC))
    assert failed.reason == "CheckpointStoreDenied"
    assert (
        failed.message == "checkpoint store s3://b/p (endpoint http://s3:8333) refused reading the log: 403 Forbidden"
    )
    verdict = judge(None, failed, ())
    assert verdict.action == "FailJob"
    assert verdict.rule is not None and "CheckpointStoreDenied" in verdict.rule


def test_a_marked_gang_failure_fails_the_job_unless_a_users_rule_restarts_it() -> None:
    held = GangFailure(
        attempt=2, node=0, rank=3, exit_code=1, reason="Error", message=TAIL, time=datetime(2026, 1, 1, tzinfo=UTC)
    )
    failed = held_failure(held, None, "j-node-0")
    assert (failed.reason, failed.attempt, failed.exit_code) == ("CheckpointStoreDenied", 2, 1)
    assert failed.message.startswith("checkpoint store s3://b/p") and "Traceback" not in failed.message
    assert judge(None, failed, ()).action == "FailJob"
    mine = policy({"action": "RestartJob", "onFailureReasons": ["CheckpointStoreDenied"]})
    assert judge(mine, failed, ()).action == "RestartJob"


@pytest.mark.parametrize(
    "text",
    [
        "[kubetrain-unrecoverable NoSuchThing] made up",  # an unknown reason counts for nothing
        "Error: 403 Forbidden while reading",  # no mark: an ordinary failure
    ],
)
def test_an_unmarked_failure_keeps_its_reason_and_restarts(text: str) -> None:
    held = GangFailure(
        attempt=0, node=0, rank=0, exit_code=1, reason="Error", message=text, time=datetime(2026, 1, 1, tzinfo=UTC)
    )
    failed = held_failure(held, None, "j-node-0")
    assert failed.reason == "Error"
    assert judge(None, failed, ()).action == "RestartJob"
