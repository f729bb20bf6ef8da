"""Pure: what a gang failure is, and what it leads to.

* `failure_of` / `stall_failure` turn a failed, deleted, stuck or stalled pod into the
  `Failure` that status.failures[] records; `describe` is its one-line account.
* `judge` applies `runPolicy.failurePolicy` (after Kubernetes' podFailurePolicy and
  JobSet's failurePolicy): the user's rules in order, then the defaults below, then
  RestartJob. Its `Verdict` names the rule, so conditions and Events can say why.
* `completed` is the late-crash rule: once rank 0 recorded `done` and the newest
  checkpoint holds that step, the work is saved and no failure reruns it.
* `repeated_error` is the repeated-error rule of shipped functions: an attempt that fails with
  the error the attempt before it failed with is not retried (`error_of` reads the error).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from kubetrain.api.contract import UNRECOVERABLE_REASONS, find_unrecoverable
from kubetrain.api.models import (
    ExitCodesRequirement,
    Failure,
    FailureAction,
    FailurePolicy,
    FailurePolicyRule,
    PodConditionPattern,
    Progress,
    TrainingJobStatus,
)
from kubetrain.api.records import GangFailure
from kubetrain.operator.pods import PodCondition, PodView

MESSAGE_TAIL = 2048
# Set by Kubernetes (1.26+) on a pod it is about to stop for reasons not the pod's own:
# preemption, eviction (API or node pressure), taint-based deletion, node shutdown, pod GC.
DISRUPTION_CONDITION = "DisruptionTarget"
# Pod-level reasons of the same disruptions where no condition is set (older kubelets, node
# controllers): node-pressure eviction, preemption, a lost node, graceful node shutdown.
DISRUPTION_REASONS = ("Evicted", "Preempted", "NodeLost", "Terminated")
# Applied after the user's rules: a disruption is not the job's fault, so it does not use up
# the restart budget.
# A pod deleted while it ran (kubectl delete pod, an admin's or a controller's clean-up) is a
# disruption too, even where Kubernetes sets no DisruptionTarget condition for it.
DELETED_REASON = "PodDeleted"
DISRUPTION_RULES = (
    FailurePolicyRule(
        action="RestartJobAndIgnoreMaxRestarts", on_pod_conditions=[PodConditionPattern(type=DISRUPTION_CONDITION)]
    ),
    FailurePolicyRule(
        action="RestartJobAndIgnoreMaxRestarts", on_failure_reasons=[*DISRUPTION_REASONS, DELETED_REASON]
    ),
)
# An attempt restarted in place that did not rendezvous in time is recreated; the failure that
# led to it was counted already, so by default the fallback is not.
IN_PLACE_TIMEOUT_REASON = "InPlaceRestartTimedOut"
# A failure the trainer marked unrecoverable (api/contract.py: credentials, a missing bucket, a
# checkpoint of another configuration, a store another job took over) would only fail again: the
# job fails at once instead of spending its restarts. A user's rule comes first and may restart it.
UNRECOVERABLE_RULE = FailurePolicyRule(action="FailJob", on_failure_reasons=list(UNRECOVERABLE_REASONS))
DEFAULT_RULES = (
    *DISRUPTION_RULES,
    FailurePolicyRule(action="RestartJobAndIgnoreMaxRestarts", on_failure_reasons=[IN_PLACE_TIMEOUT_REASON]),
    UNRECOVERABLE_RULE,
)

FailureKind = Literal["failed", "deleted", "stuck"]


def _disruption(pod: PodView) -> PodCondition | None:
    return next((c for c in pod.conditions if c.type == DISRUPTION_CONDITION and c.status == "True"), None)


def failure_of(pod: PodView, attempt: int, kind: FailureKind, now: datetime) -> Failure:
    disruption = _disruption(pod)
    if disruption is not None and pod.reason not in DISRUPTION_REASONS:
        # PreemptionByScheduler, EvictionByEvictionAPI, ...: says more than "Error" or "PodDeleted".
        reason = disruption.reason or DISRUPTION_CONDITION
        message = disruption.message or f"pod {pod.name} was disrupted ({reason})"
    elif kind == "deleted":
        reason, message = DELETED_REASON, f"pod {pod.name} was deleted while the attempt ran"
    elif kind == "stuck":
        reason = pod.waiting_reason or "Stuck"
        message = f"pod {pod.name} waited in {reason} longer than the stuck timeout"
    else:
        reason = pod.reason or ("Error" if pod.exit_code else "Failed")
        message = pod.message
        reason, message = _unrecoverable(reason, message)
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


def held_failure(held: GangFailure, pod: PodView | None, pod_name: str) -> Failure:
    """The failure a gang's torchrun agent reported (its `failure` record): the node's pod, the
    process rank and exit code on it; `pod` is that node's pod as observed, when it is."""
    message = held.message
    if held.rank is not None and f"rank {held.rank}" not in message:
        message = f"worker rank {held.rank}: {message}" if message else f"worker rank {held.rank}"
    reason, message = _unrecoverable(held.reason, message)
    return Failure(
        attempt=held.attempt,
        rank=held.node,
        pod=pod_name,
        node=pod.node if pod is not None else None,
        exit_code=held.exit_code,
        reason=reason[:256],
        message=message[-MESSAGE_TAIL:],
        time=held.time,
    )


def _unrecoverable(reason: str, message: str) -> tuple[str, str]:
    """(reason, message) of a failure whose text carries the trainer's unrecoverable mark: its
    reason, and its one sentence instead of the log tail (the cause first, no traceback); else
    as given."""
    found = find_unrecoverable(message)
    return found if found is not None else (reason, message)


def in_place_timeout_failure(
    attempt: int, detected: datetime, timeout: timedelta, now: datetime, waiting_on: str
) -> Failure:
    """`waiting_on`: the attempt's timeline's words for what it was still waiting on (which
    torchrun agents had not restarted their workers, or rank 0's rendezvous)."""
    message = (
        f"attempt {attempt}, restarted in place at {stamp(detected)}, did not complete its rendezvous within "
        f"{int(timeout.total_seconds())} s (waiting on {waiting_on}); the gang is recreated"
    )
    return Failure(attempt=attempt, reason=IN_PLACE_TIMEOUT_REASON, message=message, time=now)


def stamp(time: datetime) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ")


def stall_failure(
    rank0: PodView,
    attempt: int,
    progress: Progress | None,
    running_since: datetime,
    hang_timeout: int | None,
    startup_timeout: int | None,
    now: datetime,
    culprit: tuple[PodView | None, str] | None = None,
) -> Failure:
    """The failure a stall records: how long, the last progress rank 0 reported, and, from every
    rank's stacks (operator/forensics.py), the pod of the rank that hung and why it is blamed.
    Stacks that blame no rank make a failure of the gang (no rank, no pod): rank 0 only reported
    the stall, it is not proven to have caused it."""
    if progressed_since(progress, running_since):
        assert progress is not None and progress.updated_at is not None
        last = f"last progress: step {progress.step} at {stamp(progress.updated_at)}"
        message = f"rank 0 (pod {rank0.name}) reported no progress for hangTimeoutSeconds={hang_timeout}; {last}"
    else:
        message = (
            f"rank 0 (pod {rank0.name}) wrote no record within startupTimeoutSeconds={startup_timeout} of "
            f"attempt {attempt} starting to run at {stamp(running_since)} (start-up: imports, rendezvous, "
            "data, model, checkpoint loading)"
        )
    pod: PodView | None = rank0
    if culprit is not None:
        pod, why = culprit
        message = f"{message}; {why}" if pod is not None else f"{message}; culprit unknown: {why}"
    return Failure(
        attempt=attempt,
        rank=pod.rank if pod is not None else None,
        pod=pod.name if pod is not None else None,
        node=pod.node if pod is not None else None,
        reason="Stalled",
        message=message[-MESSAGE_TAIL:],
        time=now,
    )


def progressed_since(progress: Progress | None, running_since: datetime) -> bool:
    """Whether rank 0 recorded progress in this attempt (since it started running): the previous
    attempt's progress must not count for a fresh one."""
    return progress is not None and progress.updated_at is not None and progress.updated_at >= running_since


def stall_due(
    progress: Progress | None, running_since: datetime, hang_timeout: int | None, startup_timeout: int | None
) -> datetime | None:
    """When the attempt counts as stalled: startup_timeout after it started running until rank 0
    recorded progress in it, then hang_timeout after rank 0's last progress; None if that bound is off."""
    if progressed_since(progress, running_since):
        assert progress is not None and progress.updated_at is not None
        return None if hang_timeout is None else progress.updated_at + timedelta(seconds=hang_timeout)
    return None if startup_timeout is None else running_since + timedelta(seconds=startup_timeout)


def describe(failure: Failure) -> str:
    if failure.rank is None and failure.pod is None:
        what = f"attempt {failure.attempt}"  # a failure of the gang, not of one pod (InPlaceRestartTimedOut)
    else:
        what = f"node {failure.rank} (pod {failure.pod}"
        what += f" on {failure.node})" if failure.node else ")"
    code = f" with exit code {failure.exit_code}" if failure.exit_code is not None else ""
    detail = f": {failure.message.strip().splitlines()[-1]}" if failure.message.strip() else ""
    return f"{what} failed{code} ({failure.reason}){detail}"[:1024]


# --- the failure policy -----------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    action: FailureAction
    # "failurePolicy.rules[0] (FailJob on exit code 2)"; None when no rule matched.
    rule: str | None = None


def is_disruption(failure: Failure, conditions: Sequence[PodCondition]) -> bool:
    """Stopped from outside (deleted, evicted, preempted, ...) rather than failed: what the
    default rules do not count, whatever the user's rules say."""
    return any(_matches(rule, failure, conditions) for rule in DISRUPTION_RULES)


def judge(policy: FailurePolicy | None, failure: Failure, conditions: Sequence[PodCondition]) -> Verdict:
    for index, rule in enumerate(policy.rules if policy is not None else []):
        if _matches(rule, failure, conditions):
            return Verdict(rule.action, f"failurePolicy.rules[{index}] ({describe_rule(rule)})")
    for rule in DEFAULT_RULES:
        if _matches(rule, failure, conditions):
            return Verdict(rule.action, f"the default failure policy ({describe_rule(rule)})")
    return Verdict("RestartJob")


def _matches(rule: FailurePolicyRule, failure: Failure, conditions: Sequence[PodCondition]) -> bool:
    if rule.on_exit_codes is not None:
        return _exit_code_matches(rule.on_exit_codes, failure.exit_code)
    if rule.on_pod_conditions is not None:
        return any(c.type == p.type and c.status == p.status for p in rule.on_pod_conditions for c in conditions)
    return failure.reason in (rule.on_failure_reasons or [])


def _exit_code_matches(requirement: ExitCodesRequirement, code: int | None) -> bool:
    # As in Kubernetes: a pod without an exit code (deleted, stuck) matches neither operator,
    # and success (0) never matches NotIn.
    if code is None:
        return False
    listed = code in requirement.values
    return listed if requirement.operator == "In" else not listed and code != 0


def describe_rule(rule: FailurePolicyRule) -> str:
    if rule.on_exit_codes is not None:
        codes = ", ".join(str(v) for v in rule.on_exit_codes.values)
        plural = "s" if len(rule.on_exit_codes.values) > 1 else ""
        match = f"exit code{plural} {codes}" if rule.on_exit_codes.operator == "In" else f"exit code not in {codes}"
    elif rule.on_pod_conditions is not None:
        names = [p.type if p.status == "True" else f"{p.type}={p.status}" for p in rule.on_pod_conditions]
        match = f"pod condition {' or '.join(names)}"
    else:
        match = f"reason {' or '.join(rule.on_failure_reasons or [])}"
    return f"{rule.action} on {match}"


# --- the late-crash rule ----------------------------------------------------------------


def completed(status: TrainingJobStatus) -> str | None:
    """Why the work is complete, or None: rank 0 recorded `done` (progress.doneAt, which a new
    run's records clear) and the newest checkpoint holds at least the step it finished at."""
    progress, checkpoint = status.progress, status.last_checkpoint
    if progress is None or progress.done_at is None or progress.step is None or checkpoint is None:
        return None
    if checkpoint.step < progress.step:
        return None
    return (
        f"rank 0 recorded done at step {progress.step} ({stamp(progress.done_at)}) and checkpoint "
        f"{checkpoint.path} holds step {checkpoint.step}"
    )


# --- the repeated-error rule ------------------------------------------------------------

# A traceback's frame line, as Python prints it (torchrun's failure summary indents it further).
_FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$')
# The exception line that ends a traceback: a (dotted) class name, then its text if it has one.
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::|$)")
# Errors that say a peer, the network or the environment failed, not the function: torch's
# distributed errors (a lost peer, a store or backend timeout, torchrun's own ChildFailedError)
# and kubetrain's reports about the rendezvous. They can repeat word for word while a fault
# lasts, and a restart is what cures them.
ENVIRONMENT_ERRORS = ("torch.distributed.", "kubetrain.")
REPEATED_REASON = "RepeatedError"


@dataclass(frozen=True)
class Raised:
    """A Python exception as a failure message shows it: its `Type: text` line and where it was
    raised (the innermost frame of its traceback, `file:line`)."""

    exception: str
    where: str

    def __str__(self) -> str:
        return f"{self.exception} at {self.where}"


def error_of(message: str) -> Raised | None:
    """The last exception a failure message shows with its traceback, or None.

    Read from the end, so what a message keeps of a long traceback (the tail of a log, the error
    file's text) is enough: the last frame line, then the first line below it that is not
    indented deeper (the frame's source and carets are) is the exception. Both ways a function's
    failure reaches status carry that traceback: the agent's `failure` record (the error file
    the runner writes through torchrun) and a pod's termination message (torchrun's failure
    summary, which quotes the same file). Nothing volatile is kept: no time, pid or host."""
    lines = message.splitlines()
    frames = [(i, m) for i, line in enumerate(lines) if (m := _FRAME.match(line))]
    if not frames:
        return None
    index, frame = frames[-1]
    indent = len(frame["indent"])
    for line in lines[index + 1 :]:
        if not line.strip() or len(line) - len(line.lstrip()) > indent:
            continue
        exception = line.strip()
        if not _EXCEPTION.match(exception):
            return None
        return Raised(exception[:512], f"{frame['file']}:{frame['line']}")
    return None


def repeated_error(previous: Failure | None, failure: Failure) -> Raised | None:
    """The error `failure` repeats, when the attempt before it failed with the same one (the same
    exception type and text, raised at the same file:line, by whichever rank): a restart would
    only fail again. None for a different error, an earlier attempt that did not fail (or
    failed otherwise), an error of the environment (ENVIRONMENT_ERRORS), or a message without a
    traceback. Not the rank: a deterministic error fails on every rank, and which one is
    observed first is a race."""
    if previous is None or previous.attempt != failure.attempt - 1:
        return None
    error = error_of(failure.message)
    if error is None or error.exception.startswith(ENVIRONMENT_ERRORS):
        return None
    return error if error_of(previous.message) == error else None
