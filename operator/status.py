"""Pure reconcile logic: (job, observed pods, now) → next status and the actions to take.

No client and no clock: `decide()` is a function of its arguments, so every path (gang
restart, deadline, suspend, TTL, failure policy, hang) is a table-driven unit test, and the
controller (or the local runner) only applies the `Decision`. Level-based: nothing here
depends on which event woke the operator. Everything beyond the pods comes from `job.spec`
and `job.status` (hang detection and the late-crash rule read `status.progress`, which both
callers fold from rank 0's records with `kubetrain.api.records.fold`).

One short stage per concern of the decision; the definitions below, which docs/operator.md
repeats, stand beside the stages that implement them. The types a decision is made of live in
decision.py, the pass the stages share in decide_pass.py, the elastic stages in elastic.py, the
conditions' helpers in conditions.py, the pods as seen in pods.py.

`decide` is a dispatcher over named stages, each returning the Decision once it decided:
finished (cleanup, TTL) → suspend → resume → members (an elastic gang's, operator/elastic.py) → gang
mode (operator/podgroup.py) → first problem → shrink (elastic) or restart-or-fail → success →
stragglers → timeouts → stalled → grow (elastic) → placement (PodsScheduled) → converge (create what
is missing, an elastic job's quorum first and nothing beyond Kueue's admitted count, delete older
attempts).

Definitions docs/operator.md repeats:
  * Success: every node's pod of the current attempt exited 0 (phase Succeeded). A job
    whose rank 0 finished while another rank hangs stays Running until its deadline (or its
    hangTimeoutSeconds, see the late-crash rule).
  * Gang failure: a pod of the current attempt is Failed (any exit code, evicted), was
    deleted (terminating, or missing after all pods of the attempt had been observed), or is
    stuck waiting (ImagePullBackOff, CrashLoopBackOff, ...) and was scheduled longer than
    `stuck_timeout` ago (Kubernetes records no start of the wait; time waiting for a node
    does not count); or the gang stalled, while the Running condition is True: rank 0 wrote
    no record for `startupTimeoutSeconds` after the attempt started running (Running's
    lastTransitionTime; default with hangTimeoutSeconds: the larger of it and 600 s), or its
    `progress.updatedAt`, once it moved in this attempt, has not advanced for
    `hangTimeoutSeconds`: an earlier attempt's progress never trips a fresh one, and a slow
    start-up is not timed by the step time. The first failure in time is blamed (earliest
    finish, then lowest rank).
  * Late-crash rule (`failures.completed`): when rank 0 recorded `done` (progress.doneAt) and
    lastCheckpoint holds at least that step, a gang failure does not rerun the job: it
    succeeds at once with reason CompletedBeforeFailure, the failure named in the message
    (not recorded in failures[]; the pods still running are cleaned up by cleanPodPolicy).
  * Straggler rule, beside it: when the work is saved the same way but pods of the attempt
    still run `Policy.straggler_timeout` after doneAt, the job succeeds with reason
    CompletedWithStragglers, those pods named (condition and a Straggler Event) and deleted.
  * Failure policy (`failures.judge`): runPolicy.failurePolicy.rules in order, then the
    defaults (a disruption restarts without counting), then RestartJob. FailJob fails with
    reason FailurePolicy, the rule named in the message.
  * Repeated-error rule (`failures.repeated_error`), for shipped functions: a failure that the
    failure policy would restart (no rule matched it) while the attempt before failed with the
    same error (exception type and text, raised at the same file:line, whichever rank) fails the
    job with reason RepeatedError instead of restarting it; errors of torch.distributed and
    kubetrain (a lost peer, a timeout, the rendezvous) are always restarted.
    An init container failed word for word as in the attempt before fails any job the same way.
  * Gang restart: the failure is recorded, `attempt` goes up and `restarts` (or, for
    RestartJobAndIgnoreMaxRestarts, `uncountedRestarts`) too; the status patch is the commit
    point and goes first, then every pod of older attempts is deleted and the new attempt's
    pods are created as their names free up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from kubetrain.api import naming
from kubetrain.api.contract import startup_timeout_seconds
from kubetrain.api.function import runs_function
from kubetrain.api.models import (
    MAX_FAILURES_KEPT,
    AttemptStart,
    Failure,
    ReplicaCounts,
    TrainingJob,
    TrainingJobStatus,
)
from kubetrain.api.records import GangFailure
from kubetrain.operator import elastic, podgroup, timeline
from kubetrain.operator.conditions import derive_phase, get_condition, is_true
from kubetrain.operator.decide_pass import Pass, Problem
from kubetrain.operator.decision import DEFAULT_POLICY, Decision, Event, Hold, Policy, StaleView
from kubetrain.operator.failures import (
    REPEATED_REASON,
    FailureKind,
    completed,
    describe,
    failure_of,
    held_failure,
    in_place_timeout_failure,
    is_disruption,
    judge,
    progressed_since,
    repeated_error,
    stall_due,
    stall_failure,
    stamp,
)
from kubetrain.operator.forensics import RankStacks, blame
from kubetrain.operator.pods import INIT_CONTAINER_FAILED, STUCK_REASONS, TERMINAL_PHASES, PodView


def _observe(job: TrainingJob, uid: str, pods: list[PodView], now: datetime, policy: Policy) -> Pass:
    previous = job.status or TrainingJobStatus()
    status = previous.model_copy(deep=True)
    status.observed_generation = job.metadata.generation
    ours = [p for p in pods if p.job_uid in (None, uid)]
    if any(p.attempt is not None and p.attempt > status.attempt for p in ours):
        raise StaleView(f"pods of an attempt newer than {status.attempt}")
    live = [p for p in ours if not p.terminating]
    # The gang mode its GangScheduling condition recorded for the attempt (_choose_gang records a new one).
    gang = podgroup.recorded_mode(previous)
    return Pass(
        job=job,
        uid=uid,
        now=now.replace(microsecond=0),
        precise=now.replace(microsecond=now.microsecond // 1000 * 1000),
        policy=policy,
        previous=previous,
        decision=Decision(status=status, gang_mode=gang, group_api=podgroup.api_for(gang, policy.group_apis)),
        ours=ours,
        occupied={p.name for p in pods},
        live=live,
        current=[p for p in live if p.attempt == status.attempt],
        stale=[p for p in live if p.attempt != status.attempt],
    )


def decide(
    job: TrainingJob,
    uid: str,
    pods: list[PodView],
    service_exists: bool,
    now: datetime,
    policy: Policy = DEFAULT_POLICY,
    hold: Hold | None = None,
    stacks: Mapping[int, RankStacks] | None = None,
    *,
    admitted: int | None = None,
) -> Decision:
    """`hold`: a queue keeps the job suspended (operator/kueue.py). `stacks`: every rank's stacks
    from the pods' logs (operator/forensics.py), given when a stall is being decided, so the
    Stalled failure names the rank that hung. `admitted`: how many nodes Kueue admitted (an
    elastic job's partial admission): no rank beyond them gets a pod. `now` may carry a fraction
    of a second: only the timeline keeps it (to the millisecond); every other time is whole seconds."""
    run = _observe(job, uid, pods, now, policy)
    run.stacks, run.admitted = stacks, admitted
    if is_true(run.status, "Succeeded") or is_true(run.status, "Failed"):
        return _cleanup(run)
    if job.spec.run_policy.suspend:
        return _suspend(run)
    if hold is not None:
        return _suspend(run, hold)
    _resume(run)
    _carry_over(run)
    elastic.split_members(run)
    unavailable = _choose_gang(run)
    if unavailable is not None:
        return _finish(run, False, "GangSchedulingUnavailable", unavailable)
    problem, held = _first_problem(run)
    if problem is not None and not held and elastic.shrink(run, problem):
        return _resized(run, service_exists)
    if problem is not None:
        return _restart_or_fail(run, problem, service_exists, in_place=held and _in_place(run))
    overdue = _in_place_overdue(run)
    if overdue is not None:
        return _restart_or_fail(run, overdue, service_exists)
    if _gang_succeeded(run):
        return _finish(run, True, "AllNodesSucceeded", f"all {job.spec.nodes} nodes exited 0")
    stragglers = _stragglers(run)
    if stragglers is not None:
        return stragglers
    timed_out = _timed_out(run)
    if timed_out is not None:
        return _finish(run, False, *timed_out)
    stall = _stalled(run)
    if stall is not None:
        return _restart_or_fail(run, stall, service_exists, in_place=_in_place(run, stalled=True))
    if elastic.grow(run):
        return _resized(run, service_exists)
    _placement(run)
    return _converge(run, service_exists)


# --- stages -----------------------------------------------------------------------------


def _suspend(run: Pass, hold: Hold | None = None) -> Decision:
    status = run.status
    hold = hold or Hold("Suspended", "runPolicy.suspend is true: the pods are deleted")
    reason, message = hold.reason, hold.message
    before = get_condition(run.previous, "Suspended")
    if run.condition("Suspended", True, reason, message) or (before is not None and before.reason != reason):
        run.decision.events.append(Event("Normal", "Suspended", f"job suspended: {message}"))
        run.condition("Running", False, "Suspended", "the job is suspended", only_if_present=True)
        run.condition("Restarting", False, "Suspended", "the job is suspended", only_if_present=True)
    if run.current:
        # The resumed gang is a fresh attempt; suspension is not a failure and does not
        # count against maxRestarts. A preemption is a disruption: counted, but not charged.
        status.attempt += 1
        status.uncounted_restarts += hold.disruption
        elastic.reform(run)
    # As for a batch/v1 Job, the deadline clock stops while suspended and restarts on resume.
    status.start_time = None
    status.replicas = ReplicaCounts()
    status.timeline = None
    run.decision.delete_pods = [(p.name, p.uid) for p in run.live]
    run.decision.commit_first = True
    status.phase = derive_phase(status)
    return run.decision


def _resume(run: Pass) -> None:
    if is_true(run.status, "Suspended"):
        run.condition("Suspended", False, "Resumed", "not suspended nor held by a queue: the gang is recreated")
        run.decision.events.append(Event("Normal", "Resumed", "job resumed"))


def _choose_gang(run: Pass) -> str | None:
    """Before an attempt's first pod, record its gang mode (operator/podgroup.py) in the
    GangScheduling condition; the message that fails the job when the mode cannot be had."""
    served = run.policy.group_apis
    if served is None or run.current:
        return None
    choice = podgroup.choose(run.job.spec, served)
    if choice.mode is None:
        return choice.message
    grouped = choice.mode != "none"
    # The condition says which mode every job got; only the gang's start is worth an Event.
    if run.condition(podgroup.CONDITION, grouped, choice.reason, choice.message) and grouped:
        run.decision.events.append(Event("Normal", podgroup.CONDITION, choice.message))
    run.decision.gang_mode, run.decision.group_api = choice.mode, podgroup.api_for(choice.mode, served)
    return None


def _first_problem(run: Pass) -> tuple[Problem | None, bool]:
    """The gang failure to act on: the first in time (its consequences follow it); a lost pod
    before a failure its gang's torchrun agents hold (reported in their `failure` record).
    Whether it is such a held failure."""
    attempt = run.status.attempt
    failed = sorted((p for p in run.current if p.phase == "Failed"), key=lambda p: (p.finished or run.now, p.rank or 0))
    deleted = [p for p in run.ours if p.terminating and p.attempt == attempt]
    problems: list[tuple[PodView, FailureKind]] = [
        *((p, "failed") for p in failed),
        *((p, "deleted") for p in [*deleted, *run.vanished(deleted)]),
        *((p, "stuck") for p in _stuck(run)),
    ]
    if problems:
        pod, kind = problems[0]
        return (failure_of(pod, attempt, kind, run.now), pod.conditions), False
    held = sorted((p.held for p in run.current if p.held is not None and p.held.attempt == attempt), key=_held_order)
    if not held:
        return None, False
    first = held[0]
    blamed = _by_rank(run.current).get(first.node)
    failure = held_failure(first, blamed, naming.pod_name(run.job.name, first.node))
    return (failure, blamed.conditions if blamed is not None else ()), True


def _held_order(held: GangFailure) -> tuple[datetime, int]:
    return held.time, held.node


def _in_place(run: Pass, *, stalled: bool = False) -> bool:
    """Whether the gang can restart inside its pods: runPolicy.restartStrategy InPlace, and every
    node's pod of the attempt is there and running. A stalled gang also needs every pod Ready:
    each torchrun agent runs its workers, so it can be told to restart them."""
    if run.run.restart_strategy != "InPlace" or not run.members or len(_by_rank(run.current)) != run.size:
        return False
    if any(p.phase != "Running" for p in run.current):
        return False
    return not stalled or all(p.ready for p in run.current)


def _carry_over(run: Pass) -> None:
    """Pods still labelled with the attempt before an in-place restart (the operator stopped
    before relabelling them, or the watch has not shown it yet): move them again."""
    line, attempt = run.status.timeline, run.status.attempt
    if line is None or line.start != "InPlace" or line.attempt != attempt:
        return
    moved = [p for p in run.stale if p.attempt == attempt - 1 and p.phase == "Running"]
    run.decision.restart_in_place += [(p.name, p.uid) for p in moved]
    run.current += [replace(p, attempt=attempt, held=None) for p in moved]
    run.stale = [p for p in run.stale if p not in moved]


def _in_place_overdue(run: Pass) -> Problem | None:
    """An attempt restarted in place whose rank 0 has not joined its process group within
    Policy.in_place_timeout: it is recreated (see failures.in_place_timeout_failure)."""
    line, timeout = run.status.timeline, run.policy.in_place_timeout
    if line is None or line.start != "InPlace" or line.attempt != run.status.attempt:
        return None
    if line.rendezvous_at is not None or line.detected_at is None or not run.members:
        return None
    due = line.detected_at + timeout
    if run.now < due:
        run.decision.requeue((due - run.now).total_seconds())
        return None
    waited = timeline.waiting_on(line, run.current, run.size)
    return in_place_timeout_failure(line.attempt, line.detected_at, timeout, run.now, waited), ()


def _stuck(run: Pass) -> list[PodView]:
    stuck = []
    for p in run.current:
        since = p.scheduled_at or p.created
        if p.phase == "Pending" and p.waiting_reason in STUCK_REASONS and since is not None:
            due = since + run.policy.stuck_timeout
            if run.now >= due:
                stuck.append(p)
            else:
                run.decision.requeue((due - run.now).total_seconds())
    return stuck


def _restart_or_fail(run: Pass, problem: Problem, service_exists: bool, *, in_place: bool = False) -> Decision:
    failure, conditions = problem
    status, policy = run.status, run.run
    done = completed(status)
    if done is not None:
        # The late-crash rule: the work is saved; rerunning it would only redo the last steps.
        return _finish(run, True, "CompletedBeforeFailure", f"{done}; then {describe(failure)}; not restarted")
    verdict = judge(policy.failure_policy, failure, conditions)
    previous = status.failures[-1] if status.failures else None
    status.failures = [*(status.failures or []), failure][-MAX_FAILURES_KEPT:]
    run.decision.commit_first = True
    if not is_disruption(failure, conditions):
        # The survivors of a crash or a stall cannot checkpoint: no reason to wait for them.
        run.decision.delete_grace_seconds = run.policy.failed_gang_grace_seconds
    if verdict.action == "FailJob":
        return _finish(run, False, "FailurePolicy", f"{describe(failure)}; failed by {verdict.rule}")
    counted = verdict.action == "RestartJob"
    repeated = _repeated(run, previous, failure) if counted and verdict.rule is None else None
    if repeated is not None:
        return _finish(run, False, REPEATED_REASON, repeated)
    if counted and status.restarts >= policy.max_restarts:
        message = f"{describe(failure)}; no restarts left (maxRestarts {policy.max_restarts})"
        return _finish(run, False, "BackoffLimitExceeded", message)
    status.attempt += 1
    if counted:
        status.restarts += 1
        budget = f"restart {status.restarts} of {policy.max_restarts}"
    else:
        status.uncounted_restarts += 1
        budget = "not counted against maxRestarts"
    rule = f"; {verdict.rule}" if verdict.rule else ""
    how = "in place " if in_place else ""
    message = f"{describe(failure)}; restarting the whole gang {how}as attempt {status.attempt} ({budget}{rule})"
    run.condition("Restarting", True, failure.reason, message)
    run.condition("Running", False, "Restarting", message, only_if_present=True)
    run.decision.events.append(Event("Warning", "GangRestart", message))
    status.replicas = ReplicaCounts()
    start: AttemptStart = "InPlace" if in_place else "Recreate"
    status.timeline = timeline.begin(status.attempt, start, failed_at=failure.time, detected_at=run.precise)
    if in_place:
        # Nothing is deleted: each pod moves to the new attempt and its agent restarts the workers.
        _move_in_place(run)
    else:
        run.stale, run.current, run.standby = run.live, [], []
        elastic.reform(run)
    return _converge(run, service_exists)


def _resized(run: Pass, service_exists: bool) -> Decision:
    """An elastic gang that shrank or grew (elastic.shrink, elastic.grow) restarts in place."""
    _move_in_place(run)
    return _converge(run, service_exists)


def _move_in_place(run: Pass) -> None:
    """Every pod of the attempt that is not lost (the gang's, and those on standby) moves to the
    new attempt; its agent restarts its workers, or waits, as the new attempt's members say."""
    attempt, gang = run.status.attempt, set(run.members)
    pods = [*run.current, *run.standby]
    moving = [p for p in pods if p.phase not in TERMINAL_PHASES]
    run.decision.restart_in_place = [(p.name, p.uid) for p in moving]
    moved = [replace(p, attempt=attempt, held=None, ready=False) for p in moving]
    run.current = [p for p in moved if p.rank in gang]
    run.standby = [p for p in moved if p.rank not in gang]
    run.stale += [p for p in pods if p.phase in TERMINAL_PHASES]
    if run.members:
        run.decision.requeue(run.policy.in_place_timeout.total_seconds())


def _repeated(run: Pass, previous: Failure | None, failure: Failure) -> str | None:
    """The repeated-error rule (`failures.repeated_error`), for shipped functions only: there the
    failure message is the function's own traceback, which the runner puts in torchrun's error
    file. A script's message holds one only sometimes (torchrun's summary names the exception
    only for a script that records it), and the built-in trainer's errors are mostly its reports
    on the environment (a checkpoint store, the rendezvous), which repeat word for word while an
    outage lasts. The message for the Failed condition, or None to go on.

    An init container (kubetrain's runtime, or the template's) that failed word for word as in the
    attempt before fails the job too, whatever it runs: its trainer never started, and without
    the rule a gang of such pods spends the whole budget in seconds."""
    if failure.reason == INIT_CONTAINER_FAILED:
        same = previous is not None and (previous.attempt, previous.reason, previous.message) == (
            failure.attempt - 1,
            failure.reason,
            failure.message,
        )
        if not same:
            return None
        return (
            f"{describe(failure)}; attempt {failure.attempt - 1} failed the same way before its trainer started: "
            "not restarted (a failurePolicy rule with action RestartJob restarts it anyway)"
        )
    if not runs_function(run.job.spec.command):
        return None
    error = repeated_error(previous, failure)
    if error is None:
        return None
    assert previous is not None
    return (
        f"{describe(failure)}; attempt {previous.attempt} failed with the same error ({error}): not restarted, "
        "a restart would raise it again (a failurePolicy rule with action RestartJob restarts it anyway)"
    )


def _gang_succeeded(run: Pass) -> bool:
    ranks = _by_rank(run.current)
    return bool(run.current) and len(ranks) == run.size and all(p.phase == "Succeeded" for p in run.current)


def _stragglers(run: Pass) -> Decision | None:
    """The straggler rule: the work is saved (`completed`), yet pods of the attempt still run
    `straggler_timeout` after rank 0's `done` (a rank hung in its teardown): succeed, name them
    in the condition and a Warning Event, and delete their pods whatever cleanPodPolicy says,
    so a finished job never holds its nodes."""
    done, progress = completed(run.status), run.status.progress
    if done is None or progress is None or progress.done_at is None:
        return None
    lingering = sorted((p for p in run.current if p.phase not in TERMINAL_PHASES), key=lambda p: p.rank or 0)
    if not lingering:
        return None
    due = progress.done_at + run.policy.straggler_timeout
    if run.now < due:
        run.decision.requeue((due - run.now).total_seconds())
        return None
    seconds = int(run.policy.straggler_timeout.total_seconds())
    names = ", ".join(f"node {p.rank} (pod {p.name})" for p in lingering)
    still = (
        f"{names} still running {seconds} s after done; {'its pod' if len(lingering) == 1 else 'their pods'} deleted"
    )
    run.decision.events.append(Event("Warning", "Straggler", still))
    decision = _finish(run, True, "CompletedWithStragglers", f"{done}; {still}")
    doomed = {name for name, _ in decision.delete_pods}
    decision.delete_pods += [(p.name, p.uid) for p in lingering if p.name not in doomed]
    return decision


def _timed_out(run: Pass) -> tuple[str, str] | None:
    """(reason, message) of the first timeout that passed; requeues for those still ahead."""
    policy, status = run.run, run.status
    if policy.active_deadline_seconds is not None and status.start_time is not None:
        due = status.start_time + timedelta(seconds=policy.active_deadline_seconds)
        if run.now >= due:
            return "DeadlineExceeded", f"job ran longer than activeDeadlineSeconds={policy.active_deadline_seconds}"
        run.decision.requeue((due - run.now).total_seconds())
    if policy.scheduling_timeout_seconds is None:
        return None
    # A pod the scheduler explained comes first: its message is the useful one.
    for p in sorted(run.current, key=lambda p: (not p.schedule_message, p.rank or 0)):
        if p.phase != "Pending" or p.scheduled or p.created is None:
            continue
        due = p.created + timedelta(seconds=policy.scheduling_timeout_seconds)
        if run.now >= due:
            detail = p.schedule_message or "no scheduler placed it"
            return "Unschedulable", (
                f"pod {p.name} was not scheduled within schedulingTimeoutSeconds="
                f"{policy.scheduling_timeout_seconds}: {detail}"
            )
        run.decision.requeue((due - run.now).total_seconds())
    return None


def _placement(run: Pass) -> None:
    """PodsScheduled=False (Unschedulable) with the scheduler's own message while a pod of the
    attempt waits for a node (with a gang no pod binds until all fit, and nothing else would
    say why); True again once every pod is bound. An elastic job with no gang yet (forming, or
    below its minimum) is told about its pods on standby: nothing else says why it waits."""
    nodes = run.size
    # A gang that trains has what it needs: a standby pod waiting for capacity is no news.
    pods = run.current if run.members else [*run.current, *run.standby]
    waiting = sorted(
        (p.rank or 0, p.name, c.message)
        for p in pods
        if not p.scheduled
        for c in p.conditions
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
    )
    if waiting:
        _, pod, said = waiting[0]
        message = f"pod {pod}: {said}"
        if run.condition("PodsScheduled", False, "Unschedulable", message):
            run.decision.events.append(Event("Warning", "Unschedulable", message))
    elif nodes and len(_by_rank(run.current)) == nodes and all(p.scheduled for p in run.current):
        message = f"all {nodes} pods of attempt {run.status.attempt} are bound to nodes"
        run.condition("PodsScheduled", True, "AllPodsScheduled", message, only_if_present=True)


def _stalled(run: Pass) -> Problem | None:
    """hangTimeoutSeconds: rank 0's progress stood still that long while the gang ran (and
    startupTimeoutSeconds: rank 0 wrote nothing that long after the attempt started running)."""
    hang, status = run.run.hang_timeout_seconds, run.status
    startup = startup_timeout_seconds(hang, run.run.startup_timeout_seconds)
    running = get_condition(status, "Running")
    rank0 = _by_rank(run.current).get(run.members[0]) if run.members else None
    if running is None or running.status != "True" or rank0 is None:
        return None
    due = stall_due(status.progress, running.last_transition_time, hang, startup)
    if due is None:
        return None
    if run.now < due:
        run.decision.requeue((due - run.now).total_seconds())
        return None
    culprit = None
    # The trainer's watchdog arms at the first step: a stall in start-up has no stacks to read.
    if run.stacks is not None and progressed_since(status.progress, running.last_transition_time):
        procs = run.job.spec.procs_per_node
        verdict = blame(run.stacks, run.size * procs)
        node = None if verdict.rank is None else run.members[verdict.rank // procs]
        pod = None if node is None else _by_rank(run.current).get(node)
        culprit = (pod, verdict.message)
    failure = stall_failure(
        rank0, status.attempt, status.progress, running.last_transition_time, hang, startup, run.now, culprit
    )
    run.condition("Stalled", True, "NoProgress", failure.message)
    run.decision.events.append(Event("Warning", "Stalled", failure.message))
    return failure, ()


def _finish(run: Pass, success: bool, reason: str, message: str) -> Decision:
    if run.status.timeline is not None:
        run.status.timeline = run.status.timeline.model_copy(update={"waiting_on": ""})
    run.condition("Succeeded" if success else "Failed", True, reason, message)
    run.condition("Running", False, "Succeeded" if success else "Failed", message, only_if_present=True)
    run.condition("Restarting", False, reason, message, only_if_present=True)
    run.status.completion_time = run.now
    run.decision.commit_first = True
    run.decision.events.append(Event("Normal" if success else "Warning", reason, message))
    # A restarted attempt can report progress and finish in one pass: its stall is over too.
    _progress_resumed(run)
    return _cleanup(run)


def _cleanup(run: Pass) -> Decision:
    """A finished job: delete the pods cleanPodPolicy names, and the job once its TTL passed."""
    status, policy, decision = run.status, run.run, run.decision
    if policy.clean_pod_policy == "All":
        doomed = run.live
    elif policy.clean_pod_policy == "Running":
        doomed = [p for p in run.live if p.phase not in TERMINAL_PHASES]
    else:
        doomed = []
    decision.delete_pods = [(p.name, p.uid) for p in doomed]
    if status.completion_time is not None and policy.ttl_seconds_after_finished is not None:
        due = status.completion_time + timedelta(seconds=policy.ttl_seconds_after_finished)
        if run.now >= due:
            decision.delete_job = True
        else:
            decision.requeue((due - run.now).total_seconds())
    status.replicas = _counts(run.current)
    status.phase = derive_phase(status)
    return decision


def _converge(run: Pass, service_exists: bool) -> Decision:
    """Create what is missing, delete older attempts, and report how far the gang got."""
    status, decision, nodes = run.status, run.decision, run.size
    # A standby pod that failed is deleted and created again (after a back-off): it never fails the gang.
    failed_standby = [p for p in run.standby if p.phase in TERMINAL_PHASES]
    decision.delete_pods = [(p.name, p.uid) for p in [*run.stale, *failed_standby]]
    by_rank = _by_rank(run.current)
    present = by_rank.keys() | {p.rank for p in run.standby if p not in failed_standby}
    missing = [r for r in range(run.job.spec.nodes) if r not in present]
    decision.create_ranks = [r for r in missing if naming.pod_name(run.job.name, r) not in run.occupied]
    if run.job.spec.elastic is not None:
        elastic.limit_creation(run, failed_standby)
    decision.create_service = not service_exists
    if decision.delete_pods:
        decision.commit_first = True
    if decision.create_ranks and status.start_time is None:
        status.start_time = run.now
        if run.run.active_deadline_seconds is not None:
            decision.requeue(run.run.active_deadline_seconds)
    # Pods created in this pass count as observed only when they are created before the
    # status is written; otherwise the next pass observes them.
    assumed = [] if decision.commit_first else decision.create_ranks
    # From the first pass that misses pods, even while their names are still held by the
    # previous attempt's terminating pods: that wait is part of the attempt's start (a resume
    # right after a suspend waits for them).
    if missing and (status.timeline is None or status.timeline.attempt != status.attempt):
        resumed = get_condition(status, "Suspended") is not None
        start: AttemptStart = "Resume" if resumed else "Start" if status.attempt == 0 else "Recreate"
        status.timeline = timeline.begin(status.attempt, start, detected_at=run.precise)
    if status.timeline is not None and status.timeline.attempt == status.attempt:
        # An elastic gang with no member yet: its time goes to the pods that may form it.
        pods, counted_nodes = (run.current, nodes) if nodes else ([*run.current, *run.standby], run.job.spec.nodes)
        status.timeline = timeline.advance(status.timeline, pods, counted_nodes, creating=len(assumed), now=run.precise)
        if not nodes:
            status.timeline = status.timeline.model_copy(update={"waiting_on": elastic.standby_text(run)})
    counts = _counts(run.current)
    counts.active += len(assumed)
    status.replicas = counts
    created = len(present) + len(assumed)
    if created == run.job.spec.nodes and run.condition(
        "Created", True, "PodsCreated", f"headless Service {naming.service_name(run.job.name)} and {created} pods"
    ):
        decision.events.append(
            Event("Normal", "Created", f"created headless Service and {created} pods (attempt {status.attempt})")
        )
    # Ranks that already exited 0 wait for the others: the gang still runs.
    running = bool(nodes) and len(by_rank) == nodes and all(p.phase in ("Running", "Succeeded") for p in run.current)
    line = status.timeline
    restarting = line is not None and line.start == "InPlace" and line.attempt == status.attempt
    if running and restarting and line is not None and line.rendezvous_at is None:
        # Restarted in place: the pods ran all along; the gang runs again once every torchrun
        # agent started the attempt's workers (its pod turned Ready) or rank 0 met the others.
        agents = sum(p.ready or p.phase == "Succeeded" for p in run.current)
        running, counted = agents == nodes, f"{agents} of {nodes} torchrun agents restarted their workers"
    elif not nodes:
        counted = elastic.standby_text(run)
    else:
        counted = f"{sum(p.phase == 'Running' for p in run.current)} of {nodes} pods running"
    if running:
        message = f"all {nodes} pods of attempt {status.attempt} are running"
        if run.condition("Running", True, "AllPodsRunning", message):
            decision.events.append(Event("Normal", "Running", message))
        run.condition("Restarting", False, "AllPodsRunning", message, only_if_present=True)
    else:
        run.condition(
            "Running",
            False,
            "Restarting" if is_true(status, "Restarting") else "PodsNotRunning",
            counted,
            only_if_present=True,
        )
    _progress_resumed(run)
    status.phase = derive_phase(status)
    return decision


def _progress_resumed(run: Pass) -> None:
    """Stalled goes False once rank 0 reports progress from the stall's second on: records carry
    whole seconds, and the stalled attempt's last one is at least hangTimeoutSeconds older, so a
    record of the stall's own second is the restarted gang's (a restart within that second kept
    the gang Stalled after it trained again)."""
    stalled, progress = get_condition(run.status, "Stalled"), run.status.progress
    if stalled is None or stalled.status != "True" or progress is None or progress.updated_at is None:
        return
    if progress.updated_at >= stalled.last_transition_time.replace(microsecond=0):
        message = f"rank 0 reported step {progress.step} at {stamp(progress.updated_at)}"
        run.condition("Stalled", False, "ProgressResumed", message)


# --- helpers ----------------------------------------------------------------------------


def _by_rank(pods: list[PodView]) -> dict[int, PodView]:
    return {p.rank: p for p in pods if p.rank is not None}


def _counts(pods: list[PodView]) -> ReplicaCounts:
    return ReplicaCounts(
        active=sum(p.phase not in TERMINAL_PHASES for p in pods),
        ready=sum(p.phase == "Running" for p in pods),
        succeeded=sum(p.phase == "Succeeded" for p in pods),
        failed=sum(p.phase == "Failed" for p in pods),
    )
