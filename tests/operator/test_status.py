"""decide(): every path of the reconciler as a pure function of (job, pods, now)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from support.decisions import advance, cond, make_job, message_of, step
from support.pods import JOB_UID as UID
from support.pods import T0, pod_view

from kubetrain.api.function import runner_command
from kubetrain.api.models import LastCheckpoint, Progress, TrainingJob
from kubetrain.operator.conditions import get_condition, is_true
from kubetrain.operator.decision import DEFAULT_POLICY, Decision, StaleView
from kubetrain.operator.pods import PodView
from kubetrain.operator.render import render_pod

pytestmark = pytest.mark.unit


def test_new_job_creates_service_and_every_pod() -> None:
    d = step(make_job(), [], service=False)
    assert d.create_service and d.create_ranks == [0, 1, 2] and not d.delete_pods
    assert not d.commit_first  # create first, then write the status that counts them
    assert d.status.phase == "Pending" and d.status.start_time == T0
    assert cond(d, "Created") == ("True", "PodsCreated")
    assert d.status.replicas is not None and d.status.replicas.active == 3
    assert [e.reason for e in d.events] == ["Created"]


def test_steady_state_is_a_fixed_point() -> None:
    job = make_job()
    d1 = step(job, [], service=False)
    job = advance(job, d1)
    pods = [pod_view(job, r) for r in range(3)]
    d2 = step(job, pods, T0 + timedelta(seconds=5))
    assert not d2.create_ranks and not d2.delete_pods and not d2.events and not d2.create_service
    assert d2.status.wire() == job.status.wire()  # type: ignore[union-attr]


def test_partial_creation_creates_only_the_missing_ranks() -> None:
    job = make_job()
    d = step(job, [pod_view(job, 1)], service=False)
    assert d.create_ranks == [0, 2]


def test_all_running_sets_running_and_event() -> None:
    job = advance(make_job(), step(make_job(), [], service=False))
    d = step(job, [pod_view(job, r, phase="Running") for r in range(3)])
    assert d.status.phase == "Running" and cond(d, "Running") == ("True", "AllPodsRunning")
    assert [e.reason for e in d.events] == ["Running"]
    assert d.status.replicas is not None and d.status.replicas.ready == 3


def running_job(**spec: Any) -> tuple[TrainingJob, list[PodView]]:
    job = make_job(**spec)
    job = advance(job, step(job, [], service=False))
    pods = [pod_view(job, r, phase="Running", node="n1") for r in range(job.spec.nodes)]
    return advance(job, step(job, pods)), pods


def test_one_failed_pod_restarts_the_whole_gang() -> None:
    job, pods = running_job()
    pods[1] = pod_view(job, 1, phase="Failed", exit_code=137, reason="OOMKilled", node="n1")
    d = step(job, pods, T0 + timedelta(minutes=1))
    assert d.commit_first
    assert d.status.attempt == 1 and d.status.restarts == 1
    assert sorted(d.delete_pods) == sorted((p.name, p.uid) for p in pods)
    assert d.create_ranks == []  # every name is still taken by the old attempt
    (failure,) = d.status.failures or []
    assert (failure.attempt, failure.rank, failure.pod, failure.node, failure.exit_code, failure.reason) == (
        0,
        1,
        "j-node-1",
        "n1",
        137,
        "OOMKilled",
    )
    assert "boom" in failure.message
    assert d.status.phase == "Restarting"
    assert cond(d, "Restarting") == ("True", "OOMKilled") and cond(d, "Running") == ("False", "Restarting")
    assert [e.reason for e in d.events] == ["GangRestart"]

    # The old pods are gone: the next attempt is created, and Running clears Restarting.
    job = advance(job, d)
    d = step(job, [], T0 + timedelta(minutes=2))
    assert d.create_ranks == [0, 1, 2] and d.status.attempt == 1
    job = advance(job, d)
    d = step(job, [pod_view(job, r, attempt=1, phase="Running") for r in range(3)], T0 + timedelta(minutes=3))
    assert d.status.phase == "Running" and cond(d, "Restarting") == ("False", "AllPodsRunning")


def test_old_attempt_pods_are_deleted_and_never_counted() -> None:
    job, _ = running_job()
    job = advance(job, step(job, [pod_view(job, 0, phase="Failed", exit_code=1)]))
    assert job.status is not None and job.status.attempt == 1
    leftovers = [pod_view(job, 1, attempt=0, phase="Running"), pod_view(job, 2, attempt=0, phase="Running")]
    d = step(job, leftovers)
    assert sorted(n for n, _ in d.delete_pods) == ["j-node-1", "j-node-2"]
    assert d.create_ranks == [0] and d.status.restarts == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"terminating": True}, "PodDeleted"),
        (
            {"phase": "Pending", "waiting": "ImagePullBackOff", "created": T0 - timedelta(minutes=10)},
            "ImagePullBackOff",
        ),
    ],
)
def test_deleted_or_stuck_pod_restarts_the_gang(change: dict[str, Any], reason: str) -> None:
    job, pods = running_job()
    pods[2] = pod_view(job, 2, **{"phase": "Running", **change})
    d = step(job, pods, T0 + timedelta(minutes=1))
    assert d.status.attempt == 1 and (d.status.failures or [])[-1].reason == reason


@pytest.mark.parametrize(
    ("change", "grace", "counts"),
    [
        # A deleted pod: the gang is whole, the rest get their own grace to checkpoint; not counted.
        ({"terminating": True}, None, (0, 1)),
        # A crash: the survivors cannot checkpoint; a short grace, counted.
        ({"phase": "Failed", "exit_code": 1}, DEFAULT_POLICY.failed_gang_grace_seconds, (1, 0)),
    ],
    ids=["deleted", "crashed"],
)
def test_a_disruption_keeps_the_pods_grace_and_a_crash_does_not(
    change: dict[str, Any], grace: int | None, counts: tuple[int, int]
) -> None:
    job, pods = running_job()
    pods[1] = pod_view(job, 1, **{"phase": "Running", **change})
    d = step(job, pods, T0 + timedelta(minutes=1))
    # The deleted pod is on its way already; the others go (and a failed one, which holds its name).
    doomed = {"j-node-0", "j-node-2"} | ({"j-node-1"} if "exit_code" in change else set())
    assert d.status.attempt == 1 and {n for n, _ in d.delete_pods} == doomed
    assert d.delete_grace_seconds == grace
    assert (d.status.restarts, d.status.uncounted_restarts) == counts


def test_missing_pod_after_all_were_seen_is_a_deletion() -> None:
    job, pods = running_job()
    d = step(job, pods[:2])
    assert d.status.attempt == 1 and (d.status.failures or [])[-1].reason == "PodDeleted"
    assert d.create_ranks == [2]  # its name is free: the new attempt may start there


def test_stuck_pod_within_timeout_only_requeues() -> None:
    job, pods = running_job()
    pods[0] = pod_view(job, 0, waiting="ImagePullBackOff", created=T0)
    d = step(job, pods, T0 + timedelta(minutes=1))
    assert d.status.attempt == 0 and d.requeue_after == pytest.approx(240)


def test_stuck_timeout_counts_from_scheduling_not_creation() -> None:
    """A pod that waited 10 minutes for a node and then fails one image pull is not stuck yet."""
    job, pods = running_job()
    body = render_pod(job, "ns", UID, 0, 0)
    body["metadata"].update(uid="u0", creationTimestamp="2026-01-01T11:50:00Z")
    body["spec"]["nodeName"] = "n1"
    body["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T11:59:00Z"}],
        "containerStatuses": [{"name": "trainer", "state": {"waiting": {"reason": "ErrImagePull"}}}],
    }
    pods[0] = PodView.from_pod(body)
    d = step(job, pods, T0)
    assert d.status.attempt == 0 and d.requeue_after == pytest.approx(240)
    assert step(job, pods, T0 + timedelta(minutes=4)).status.attempt == 1


def test_max_restarts_exhausted_fails_and_stops_every_running_pod() -> None:
    job, pods = running_job(runPolicy={"maxRestarts": 1})
    job = advance(job, step(job, [pod_view(job, 0, phase="Failed", exit_code=1), *pods[1:]]))
    running = [pod_view(job, r, attempt=1, phase="Running") for r in range(3)]
    job = advance(job, step(job, running))
    running[2] = pod_view(job, 2, attempt=1, phase="Failed", exit_code=3)
    d = step(job, running, T0 + timedelta(hours=1))
    assert d.status.phase == "Failed" and cond(d, "Failed") == ("True", "BackoffLimitExceeded")
    assert d.status.restarts == 1 and len(d.status.failures or []) == 2
    assert sorted(n for n, _ in d.delete_pods) == ["j-node-0", "j-node-1"]  # the failed one keeps its logs
    assert d.status.completion_time == T0 + timedelta(hours=1)
    assert cond(d, "Running") == ("False", "Failed")


def test_success_needs_every_node() -> None:
    job, _ = running_job()
    done = [pod_view(job, 0, phase="Succeeded", exit_code=0), pod_view(job, 1, phase="Succeeded", exit_code=0)]
    d = step(job, [*done, pod_view(job, 2, phase="Running")])
    assert d.status.phase == "Running"
    d = step(job, [*done, pod_view(job, 2, phase="Succeeded", exit_code=0)], T0 + timedelta(hours=2))
    assert d.status.phase == "Succeeded" and cond(d, "Succeeded") == ("True", "AllNodesSucceeded")
    assert d.status.completion_time == T0 + timedelta(hours=2) and not d.delete_pods


@pytest.mark.parametrize(
    ("policy", "deleted"),
    [("Running", ["j-node-1", "j-node-2"]), ("All", ["j-node-0", "j-node-1", "j-node-2"]), ("None", [])],
)
def test_deadline_fails_and_applies_clean_pod_policy(policy: str, deleted: list[str]) -> None:
    job, _ = running_job(runPolicy={"activeDeadlineSeconds": 60, "cleanPodPolicy": policy})
    assert job.status is not None and job.status.start_time == T0
    pods = [pod_view(job, 0, phase="Succeeded", exit_code=0), pod_view(job, 1, phase="Running"), pod_view(job, 2)]
    d = step(job, pods, T0 + timedelta(seconds=61))
    assert cond(d, "Failed") == ("True", "DeadlineExceeded") and d.status.phase == "Failed"
    assert sorted(n for n, _ in d.delete_pods) == deleted


def test_deadline_requeues_until_due() -> None:
    job, pods = running_job(runPolicy={"activeDeadlineSeconds": 600})
    d = step(job, pods, T0 + timedelta(seconds=100))
    assert d.status.phase == "Running" and d.requeue_after == pytest.approx(500)


def test_scheduling_timeout_fails_with_the_schedulers_message() -> None:
    job = make_job(runPolicy={"schedulingTimeoutSeconds": 30})
    job = advance(job, step(job, [], service=False))
    body = render_pod(job, "ns", UID, 1, 0)
    body["metadata"].update(uid="u1", creationTimestamp="2026-01-01T12:00:00Z")
    body["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes: Insufficient nvidia.com/gpu",
            }
        ],
    }
    pods = [
        pod_view(job, 0, phase="Running", node="n"),
        PodView.from_pod(body),
        pod_view(job, 2, phase="Running", node="n"),
    ]
    assert step(job, pods, T0 + timedelta(seconds=10)).requeue_after == pytest.approx(20)
    d = step(job, pods, T0 + timedelta(seconds=31))
    assert cond(d, "Failed") == ("True", "Unschedulable")
    failed = get_condition(d.status, "Failed")
    assert failed is not None and "Insufficient nvidia.com/gpu" in failed.message
    assert sorted(n for n, _ in d.delete_pods) == ["j-node-0", "j-node-1", "j-node-2"]


def test_suspend_deletes_pods_and_resume_recreates_a_fresh_attempt() -> None:
    job, pods = running_job(runPolicy={"activeDeadlineSeconds": 600})
    suspended = job.model_copy(deep=True)
    suspended.spec.run_policy.suspend = True
    d = step(suspended, pods, T0 + timedelta(minutes=1))
    assert d.status.phase == "Suspended" and cond(d, "Suspended") == ("True", "Suspended")
    assert len(d.delete_pods) == 3 and d.commit_first and not d.create_ranks
    assert d.status.attempt == 1 and d.status.restarts == 0 and d.status.start_time is None
    assert cond(d, "Running") == ("False", "Suspended")
    suspended = advance(suspended, d)
    d = step(suspended, [], T0 + timedelta(minutes=2))
    assert d.status.phase == "Suspended" and not d.create_ranks and not d.delete_pods

    resumed = advance(suspended, d).model_copy(deep=True)
    resumed.spec.run_policy.suspend = False
    d = step(resumed, [], T0 + timedelta(hours=1))
    assert cond(d, "Suspended") == ("False", "Resumed") and d.create_ranks == [0, 1, 2]
    assert d.status.start_time == T0 + timedelta(hours=1)  # the deadline clock restarts
    assert d.status.phase == "Pending"


def test_a_resume_that_waits_for_the_suspended_pods_names_times_that_wait() -> None:
    """Resumed while the suspended attempt's pods still terminate (their names are taken): the
    resumed attempt's timeline begins at once, and its pods are created once the names are free,
    so the timeline holds that wait too."""
    job, pods = running_job()
    suspended = job.model_copy(deep=True)
    suspended.spec.run_policy.suspend = True
    suspended = advance(suspended, step(suspended, pods, T0 + timedelta(minutes=1)))
    resumed = suspended.model_copy(deep=True)
    resumed.spec.run_policy.suspend = False
    leaving = [replace(p, terminating=True) for p in pods]
    d = step(resumed, leaving, T0 + timedelta(minutes=1, seconds=2))
    assert not d.create_ranks and d.status.timeline is not None
    assert (d.status.timeline.attempt, d.status.timeline.start) == (1, "Resume")
    assert d.status.timeline.detected_at == T0 + timedelta(minutes=1, seconds=2)
    d = step(advance(resumed, d), [], T0 + timedelta(minutes=1, seconds=4))
    assert d.create_ranks == [0, 1, 2] and d.status.timeline is not None
    assert d.status.timeline.detected_at == T0 + timedelta(minutes=1, seconds=2)


def test_job_created_suspended_creates_nothing() -> None:
    d = step(make_job(runPolicy={"suspend": True}), [], service=False)
    assert not d.create_ranks and not d.create_service and d.status.phase == "Suspended"


def test_ttl_after_finished() -> None:
    job, _ = running_job(runPolicy={"ttlSecondsAfterFinished": 100})
    done = [pod_view(job, r, phase="Succeeded", exit_code=0) for r in range(3)]
    job = advance(job, step(job, done, T0))
    d = step(job, done, T0 + timedelta(seconds=40))
    assert not d.delete_job and d.requeue_after == pytest.approx(60)
    assert step(job, done, T0 + timedelta(seconds=100)).delete_job


def test_finished_job_is_never_restarted() -> None:
    job, _ = running_job()
    job = advance(job, step(job, [pod_view(job, r, phase="Succeeded", exit_code=0) for r in range(3)]))
    d = step(job, [])
    assert d.status.phase == "Succeeded" and not d.create_ranks and d.status.attempt == 0


def test_pods_of_a_newer_attempt_mean_a_stale_view() -> None:
    job, _ = running_job()
    with pytest.raises(StaleView):
        step(job, [pod_view(job, 0, attempt=5)])


def test_foreign_pod_holding_a_name_blocks_only_that_rank() -> None:
    job = make_job()
    body = render_pod(job, "ns", "older-job-uid", 0, 0)
    body["metadata"]["uid"] = "x"
    d = step(job, [PodView.from_pod(body)], service=False)
    assert d.create_ranks == [1, 2] and not d.delete_pods


def test_conditions_keep_transition_time_and_track_generation() -> None:
    job, pods = running_job()
    before = get_condition(job.status, "Running")  # type: ignore[arg-type]
    job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"generation": 2})})
    d = step(job, pods, T0 + timedelta(hours=1))
    after = get_condition(d.status, "Running")
    assert before is not None and after is not None
    assert after.last_transition_time == before.last_transition_time and after.observed_generation == 2
    assert d.status.observed_generation == 2 and is_true(d.status, "Created")


def test_transition_time_moves_exactly_when_the_status_flips() -> None:
    job, pods = running_job()

    def moved(decision: Decision, kind: str) -> datetime:
        c = get_condition(decision.status, kind)
        assert c is not None, kind
        return c.last_transition_time

    t1, t2, t3 = (T0 + timedelta(minutes=m) for m in (1, 2, 3))
    d = step(job, [*pods[:2], pod_view(job, 2, phase="Failed", exit_code=1)], t1)
    assert (moved(d, "Running"), moved(d, "Restarting"), moved(d, "Created")) == (t1, t1, T0)
    job = advance(job, d)
    d = step(job, [], t2)  # still restarting: nothing flips, though reasons and messages may change
    assert (moved(d, "Running"), moved(d, "Restarting")) == (t1, t1)
    job = advance(job, d)
    d = step(job, [pod_view(job, r, attempt=1, phase="Running") for r in range(3)], t3)
    assert (moved(d, "Running"), moved(d, "Restarting"), moved(d, "Created")) == (t3, t3, T0)


def test_failure_history_is_bounded() -> None:
    job, _ = running_job(runPolicy={"maxRestarts": 100})
    for attempt in range(25):
        job = advance(job, step(job, [pod_view(job, 0, attempt=attempt, phase="Failed", exit_code=1)]))
    assert job.status is not None and job.status.restarts == 25 and len(job.status.failures or []) == 20
    assert (job.status.failures or [])[-1].attempt == 24


# --- the late-crash rule ----------------------------------------------------------------------


def with_progress(job: TrainingJob, *, step: int = 100, done: bool = True, checkpoint: int | None = 100) -> TrainingJob:
    """The job after the fold of rank 0's records: progress at `step`, maybe `done`, maybe a checkpoint."""
    assert job.status is not None
    status = job.status.model_copy(deep=True)
    status.progress = Progress(step=step, total_steps=100, updated_at=T0, done_at=T0 if done else None)
    if checkpoint is not None:
        status.last_checkpoint = LastCheckpoint(path=f"/checkpoints/step-{checkpoint}", step=checkpoint, time=T0)
    return job.model_copy(update={"status": status})


def late_crash(job: TrainingJob) -> list[PodView]:
    """Rank 0 exited 0, rank 1 aborted at teardown, rank 2 still tearing down."""
    return [
        pod_view(job, 0, phase="Succeeded", exit_code=0),
        pod_view(job, 1, phase="Failed", exit_code=134, reason="Error"),
        pod_view(job, 2, phase="Running"),
    ]


def test_late_crash_after_done_and_final_checkpoint_succeeds() -> None:
    job, _ = running_job()
    job = with_progress(job)
    d = step(job, late_crash(job), T0 + timedelta(minutes=1))
    assert d.status.phase == "Succeeded" and cond(d, "Succeeded") == ("True", "CompletedBeforeFailure")
    message = (get_condition(d.status, "Succeeded") or pytest.fail("no condition")).message
    assert "done at step 100" in message and "/checkpoints/step-100" in message
    assert "node 1" in message and "exit code 134" in message and "not restarted" in message
    assert (d.status.attempt, d.status.restarts, d.status.failures) == (0, 0, None)
    assert [n for n, _ in d.delete_pods] == ["j-node-2"]  # cleanPodPolicy Running: the one still tearing down
    assert [e.reason for e in d.events] == ["CompletedBeforeFailure"]


@pytest.mark.parametrize(
    ("done", "checkpoint"),
    [(True, 90), (True, None), (False, 100)],
    ids=["final-checkpoint-missing", "no-checkpoint", "no-done-record"],
)
def test_late_crash_without_done_and_final_checkpoint_restarts(done: bool, checkpoint: int | None) -> None:
    job, _ = running_job()
    job = with_progress(job, done=done, checkpoint=checkpoint)
    d = step(job, late_crash(job), T0 + timedelta(minutes=1))
    assert d.status.phase == "Restarting" and d.status.restarts == 1


# --- the straggler rule ------------------------------------------------------------------------


def straggling(job: TrainingJob) -> list[PodView]:
    """Rank 0 exited 0 after done; ranks 1 and 2 never exit."""
    return [
        pod_view(job, 0, phase="Succeeded", exit_code=0),
        pod_view(job, 1, phase="Running"),
        pod_view(job, 2, phase="Running"),
    ]


@pytest.mark.parametrize("clean", ["Running", "None", "All"])
def test_ranks_still_running_after_done_are_deleted_and_the_job_succeeds(clean: str) -> None:
    job, _ = running_job(runPolicy={"cleanPodPolicy": clean})
    job = with_progress(job)  # done at T0, checkpoint 100
    due = T0 + DEFAULT_POLICY.straggler_timeout
    waiting = step(job, straggling(job), due - timedelta(seconds=1))
    assert waiting.status.phase == "Running" and waiting.delete_pods == []
    assert waiting.requeue_after == pytest.approx(1.0)

    d = step(job, straggling(job), due)
    assert cond(d, "Succeeded") == ("True", "CompletedWithStragglers")
    message = message_of(d, "Succeeded")
    assert "rank 0 recorded done at step 100" in message
    assert "node 1 (pod j-node-1), node 2 (pod j-node-2) still running 90 s after done; their pods deleted" in message
    # Whatever cleanPodPolicy says, the stragglers go: a finished job must not hold its nodes.
    assert {"j-node-1", "j-node-2"} <= {n for n, _ in d.delete_pods}
    assert (d.status.attempt, d.status.restarts, d.status.failures) == (0, 0, None)
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "Straggler"), ("Normal", "CompletedWithStragglers")]


@pytest.mark.parametrize(
    ("done", "checkpoint"), [(False, 100), (True, 90)], ids=["no-done-record", "final-checkpoint-missing"]
)
def test_no_straggler_rule_before_the_work_is_saved(done: bool, checkpoint: int) -> None:
    job, _ = running_job()
    job = with_progress(job, done=done, checkpoint=checkpoint)
    d = step(job, straggling(job), T0 + timedelta(hours=1))
    assert d.status.phase == "Running" and d.delete_pods == []


# --- the failure policy -----------------------------------------------------------------------

EXIT_2_FAILS = {"failurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}}]}}
DISRUPTION = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": "evicted"}


def test_fail_job_rule_fails_at_once_naming_the_rule() -> None:
    job, pods = running_job(runPolicy=EXIT_2_FAILS)
    pods[1] = pod_view(job, 1, phase="Failed", exit_code=2, node="n1")
    d = step(job, pods, T0 + timedelta(minutes=1))
    assert cond(d, "Failed") == ("True", "FailurePolicy") and d.status.restarts == 0 and d.status.attempt == 0
    assert "exit code 2" in message_of(d, "Failed")
    assert message_of(d, "Failed").endswith("failed by failurePolicy.rules[0] (FailJob on exit code 2)")
    assert [f.exit_code for f in d.status.failures or []] == [2]
    assert sorted(n for n, _ in d.delete_pods) == ["j-node-0", "j-node-2"]


@pytest.mark.parametrize(
    ("rules", "exit_code", "outcome"),
    [
        (EXIT_2_FAILS["failurePolicy"]["rules"], 3, "counted"),  # type: ignore[index]
        ([{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [137]}}], 1, "failed"),
        ([{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [137]}}], 137, "counted"),
        ([{"action": "RestartJobAndIgnoreMaxRestarts", "onExitCodes": {"operator": "In", "values": [75]}}], 75, "free"),
        (
            [  # the first rule that matches decides
                {"action": "RestartJob", "onExitCodes": {"operator": "In", "values": [2]}},
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2, 3]}},
            ],
            2,
            "counted",
        ),
        ([{"action": "FailJob", "onFailureReasons": ["OOMKilled"]}], 137, "failed"),
        ([{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}], 137, "counted"),
    ],
)
def test_exit_code_and_reason_rules(rules: list[dict[str, Any]], exit_code: int, outcome: str) -> None:
    job, pods = running_job(runPolicy={"failurePolicy": {"rules": rules}})
    pods[0] = pod_view(job, 0, phase="Failed", exit_code=exit_code, reason="OOMKilled" if exit_code == 137 else "Error")
    d = step(job, pods, T0 + timedelta(minutes=1))
    got = {
        "Failed": "failed",
        "Restarting": "counted" if d.status.restarts else "free",
    }[d.status.phase or ""]
    assert got == outcome
    assert d.status.restarts + d.status.uncounted_restarts == (0 if outcome == "failed" else 1)


DISRUPTED: dict[str, tuple[Callable[[TrainingJob], PodView], str]] = {
    "disruption-target": (
        lambda job: pod_view(job, 1, phase="Failed", exit_code=137, node="n1", conditions=[DISRUPTION]),
        "TerminationByKubelet",
    ),
    "evicted-reason": (  # a kubelet that sets no condition: only the pod-level reason
        lambda job: replace(pod_view(job, 1, phase="Failed", node="n1"), reason="Evicted", message="low on memory"),
        "Evicted",
    ),
    "preempted-and-deleted": (
        lambda job: pod_view(
            job,
            1,
            phase="Running",
            terminating=True,
            node="n1",
            conditions=[{**DISRUPTION, "reason": "PreemptionByScheduler", "message": "preempted"}],
        ),
        "PreemptionByScheduler",
    ),
}


@pytest.mark.parametrize("case", DISRUPTED)
def test_disruptions_restart_without_counting(case: str) -> None:
    disrupted, reason = DISRUPTED[case]
    job, pods = running_job(runPolicy={"maxRestarts": 0})
    pods[1] = disrupted(job)
    d = step(job, pods, T0 + timedelta(minutes=1))
    assert d.status.phase == "Restarting" and d.status.attempt == 1
    assert (d.status.restarts, d.status.uncounted_restarts) == (0, 1)
    assert [f.reason for f in d.status.failures or []] == [reason]
    assert "not counted against maxRestarts; the default failure policy (RestartJobAndIgnoreMaxRestarts on" in (
        message_of(d, "Restarting")
    )


def test_a_rule_can_count_disruptions() -> None:
    rules = [{"action": "RestartJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]
    job, pods = running_job(runPolicy={"failurePolicy": {"rules": rules}})
    pods[1] = pod_view(job, 1, phase="Failed", exit_code=137, conditions=[DISRUPTION])
    d = step(job, pods, T0 + timedelta(minutes=1))
    assert (d.status.restarts, d.status.uncounted_restarts) == (1, 0)
    assert "failurePolicy.rules[0] (RestartJob on pod condition DisruptionTarget)" in message_of(d, "Restarting")


def test_stuck_pod_matches_a_reason_rule() -> None:
    job, pods = running_job(
        runPolicy={"failurePolicy": {"rules": [{"action": "FailJob", "onFailureReasons": ["ImagePullBackOff"]}]}}
    )
    pods[2] = pod_view(job, 2, waiting="ImagePullBackOff", created=T0 - timedelta(minutes=10))
    d = step(job, pods, T0)
    assert cond(d, "Failed") == ("True", "FailurePolicy")
    assert "failurePolicy.rules[0] (FailJob on reason ImagePullBackOff)" in message_of(d, "Failed")


# --- hang detection ---------------------------------------------------------------------------


def progressed(job: TrainingJob, at: datetime, step_: int = 50) -> TrainingJob:
    assert job.status is not None
    status = job.status.model_copy(deep=True)
    status.progress = Progress(step=step_, total_steps=100, updated_at=at)
    return job.model_copy(update={"status": status})


def test_no_progress_since_the_gang_started_running_is_a_stall() -> None:
    job, pods = running_job(runPolicy={"hangTimeoutSeconds": 60, "startupTimeoutSeconds": 90})  # Running since T0
    d = step(job, pods, T0 + timedelta(seconds=30))
    assert d.requeue_after == pytest.approx(60) and d.status.wire() == job.status.wire()  # type: ignore[union-attr]
    d = step(job, pods, T0 + timedelta(seconds=90))
    assert cond(d, "Stalled") == ("True", "NoProgress") and d.status.phase == "Restarting"
    (failure,) = d.status.failures or []
    assert (failure.reason, failure.rank, failure.pod, failure.exit_code) == ("Stalled", 0, "j-node-0", None)
    assert (
        "rank 0 (pod j-node-0) wrote no record within startupTimeoutSeconds=90 of attempt 0 starting to run at "
        "2026-01-01T12:00:00Z (start-up" in failure.message
    )
    assert d.status.restarts == 1 and d.status.attempt == 1 and len(d.delete_pods) == 3
    assert [e.reason for e in d.events] == ["Stalled", "GangRestart"]


def test_start_up_is_not_timed_by_the_hang_timeout() -> None:
    """A start-up longer than hangTimeoutSeconds (imports, rendezvous, a checkpoint to load) is not
    a stall: by default it has the larger of hangTimeoutSeconds and 600 s, and the hang timeout
    counts from rank 0's first record of the attempt."""
    job, pods = running_job(runPolicy={"hangTimeoutSeconds": 20})
    d = step(job, pods, T0 + timedelta(seconds=21))
    assert d.status.attempt == 0 and d.requeue_after == pytest.approx(579) and not is_true(d.status, "Stalled")
    started = progressed(job, T0 + timedelta(seconds=300), 1)
    d = step(started, pods, T0 + timedelta(seconds=310))
    assert d.status.attempt == 0 and d.requeue_after == pytest.approx(10)
    assert "hangTimeoutSeconds=20" in message_of(step(started, pods, T0 + timedelta(seconds=320)), "Stalled")
    assert "startupTimeoutSeconds=600" in message_of(step(job, pods, T0 + timedelta(seconds=600)), "Stalled")
    longer = running_job(runPolicy={"hangTimeoutSeconds": 900})[0]
    assert step(longer, pods, T0 + timedelta(seconds=899)).requeue_after == pytest.approx(1)


def test_a_start_up_timeout_alone_bounds_only_the_start_up() -> None:
    job, pods = running_job(runPolicy={"startupTimeoutSeconds": 30})
    assert "startupTimeoutSeconds=30" in message_of(step(job, pods, T0 + timedelta(seconds=30)), "Stalled")
    d = step(progressed(job, T0 + timedelta(seconds=10)), pods, T0 + timedelta(days=1))
    assert d.status.attempt == 0 and not is_true(d.status, "Stalled")


def test_stall_counts_from_the_last_progress_and_names_it() -> None:
    job, pods = running_job(runPolicy={"hangTimeoutSeconds": 60})
    job = progressed(job, T0 + timedelta(seconds=100))
    assert step(job, pods, T0 + timedelta(seconds=150)).requeue_after == pytest.approx(10)
    d = step(job, pods, T0 + timedelta(seconds=160))
    assert "last progress: step 50 at 2026-01-01T12:01:40Z" in message_of(d, "Stalled")


def test_the_previous_attempts_progress_does_not_trip_a_fresh_attempt() -> None:
    job, pods = running_job(runPolicy={"hangTimeoutSeconds": 60, "startupTimeoutSeconds": 60})
    job = progressed(job, T0)
    job = advance(job, step(job, [pod_view(job, 0, phase="Failed", exit_code=1), *pods[1:]], T0 + timedelta(minutes=5)))
    job = advance(job, step(job, [], T0 + timedelta(minutes=6)))
    fresh = [pod_view(job, r, attempt=1, phase="Running") for r in range(3)]
    job = advance(job, step(job, fresh, T0 + timedelta(minutes=10)))  # attempt 1 runs from here
    d = step(job, fresh, T0 + timedelta(minutes=10, seconds=30))
    assert d.status.attempt == 1 and d.requeue_after == pytest.approx(30)
    assert step(job, fresh, T0 + timedelta(minutes=11)).status.attempt == 2


def test_stalled_clears_when_progress_resumes() -> None:
    job, pods = running_job(runPolicy={"hangTimeoutSeconds": 60, "startupTimeoutSeconds": 60})
    job = advance(job, step(job, pods, T0 + timedelta(seconds=60)))
    job = advance(job, step(job, [], T0 + timedelta(seconds=70)))
    fresh = [pod_view(job, r, attempt=1, phase="Running") for r in range(3)]
    job = advance(job, step(job, fresh, T0 + timedelta(seconds=80)))
    assert cond(step(job, fresh, T0 + timedelta(seconds=85)), "Stalled") == ("True", "NoProgress")
    d = step(progressed(job, T0 + timedelta(seconds=90), 7), fresh, T0 + timedelta(seconds=91))
    assert cond(d, "Stalled") == ("False", "ProgressResumed") and "step 7" in message_of(d, "Stalled")


def test_progress_in_the_stalls_own_second_clears_it() -> None:
    # Records carry whole seconds: the restarted gang's first record, logged 0.3 s after a stall
    # decided at 60.5 s, reads 60 s. It is the new gang's all the same (the stalled one's last
    # progress is 60 s older).
    job, pods = running_job(runPolicy={"hangTimeoutSeconds": 60, "startupTimeoutSeconds": 60})
    job = advance(job, step(job, pods, T0 + timedelta(seconds=60.5)))
    assert cond(step(job, pods, T0 + timedelta(seconds=60.6)), "Stalled") == ("True", "NoProgress")
    fresh = [pod_view(job, r, attempt=1, phase="Running") for r in range(3)]
    d = step(progressed(job, T0 + timedelta(seconds=60), 1), fresh, T0 + timedelta(seconds=60.8))
    assert cond(d, "Stalled") == ("False", "ProgressResumed")


def test_progress_in_the_second_the_attempt_started_running_is_named() -> None:
    job, pods = running_job(runPolicy={"hangTimeoutSeconds": 60})  # Running since T0
    d = step(progressed(job, T0, 3), pods, T0 + timedelta(seconds=60))
    assert "last progress: step 3 at 2026-01-01T12:00:00Z" in message_of(d, "Stalled")


def test_a_stalled_attempt_that_finishes_in_one_pass_is_no_longer_stalled() -> None:
    job, pods = running_job(runPolicy={"hangTimeoutSeconds": 60, "startupTimeoutSeconds": 60})
    job = advance(job, step(job, pods, T0 + timedelta(seconds=60)))
    job = advance(job, step(job, [], T0 + timedelta(seconds=70)))
    fresh = [pod_view(job, r, attempt=1, phase="Running") for r in range(3)]
    job = advance(job, step(job, fresh, T0 + timedelta(seconds=80)))
    done = [pod_view(job, r, attempt=1, phase="Succeeded", exit_code=0) for r in range(3)]
    d = step(progressed(job, T0 + timedelta(seconds=90), 100), done, T0 + timedelta(seconds=91))
    assert cond(d, "Succeeded") == ("True", "AllNodesSucceeded")
    assert cond(d, "Stalled") == ("False", "ProgressResumed")


@pytest.mark.parametrize(
    ("rule", "phase", "counts"),
    [
        ({"action": "RestartJobAndIgnoreMaxRestarts", "onFailureReasons": ["Stalled"]}, "Restarting", (0, 1)),
        ({"action": "FailJob", "onFailureReasons": ["Stalled"]}, "Failed", (0, 0)),
    ],
)
def test_stall_follows_the_failure_policy(rule: dict[str, Any], phase: str, counts: tuple[int, int]) -> None:
    job, pods = running_job(
        runPolicy={"hangTimeoutSeconds": 60, "startupTimeoutSeconds": 60, "failurePolicy": {"rules": [rule]}}
    )
    d = step(job, pods, T0 + timedelta(seconds=61))
    assert d.status.phase == phase and (d.status.restarts, d.status.uncounted_restarts) == counts


def test_stall_after_done_and_final_checkpoint_succeeds() -> None:
    job, _ = running_job(runPolicy={"hangTimeoutSeconds": 60})
    job = with_progress(job)  # done at T0
    pods = [
        pod_view(job, 0, phase="Succeeded", exit_code=0),
        pod_view(job, 1, phase="Running"),
        pod_view(job, 2, phase="Running"),
    ]
    d = step(job, pods, T0 + timedelta(seconds=60))
    assert cond(d, "Succeeded") == ("True", "CompletedBeforeFailure") and "Stalled" in message_of(d, "Succeeded")
    assert sorted(n for n, _ in d.delete_pods) == ["j-node-1", "j-node-2"]


@pytest.mark.parametrize("spec", [{}, {"runPolicy": {"hangTimeoutSeconds": 60}}], ids=["off", "gang-not-running"])
def test_no_stall_without_a_timeout_or_a_running_gang(spec: dict[str, Any]) -> None:
    job, pods = running_job(**spec)
    if spec:
        pods[2] = pod_view(job, 2, phase="Pending")  # e.g. a pod being replaced: the Running condition goes False
        job = advance(job, step(job, pods, T0 + timedelta(seconds=1)))
    d = step(job, pods, T0 + timedelta(days=1))
    assert d.status.attempt == 0 and not is_true(d.status, "Stalled")


def test_steady_state_is_a_fixed_point_with_every_policy() -> None:
    rules = [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}},
        {"action": "RestartJobAndIgnoreMaxRestarts", "onFailureReasons": ["Stalled"]},
    ]
    job, pods = running_job(runPolicy={"hangTimeoutSeconds": 600, "failurePolicy": {"rules": rules}})
    job = advance(job, step(job, [pod_view(job, 1, phase="Failed", exit_code=1, conditions=[DISRUPTION])]))
    job = advance(job, step(job, [], T0 + timedelta(seconds=5)))
    pods = [pod_view(job, r, attempt=1, phase="Running") for r in range(3)]
    job = advance(job, step(job, pods, T0 + timedelta(seconds=10)))
    job = with_progress(job, step=40, done=False, checkpoint=40)
    d = step(job, pods, T0 + timedelta(seconds=20))
    assert not d.create_ranks and not d.delete_pods and not d.events and not d.create_service
    assert d.status.wire() == job.status.wire()  # type: ignore[union-attr]
    assert (d.status.uncounted_restarts, d.status.attempt) == (1, 1)


def test_pod_views_built_field_by_field_take_the_same_rules() -> None:
    """The local runner builds PodViews from processes (no conditions, no node): the late-crash
    rule and the blame (earliest finish, then lowest rank) hold for them too."""

    def process(rank: int, phase: str, exit_code: int | None = None, finished: datetime | None = None) -> PodView:
        return PodView(
            f"j-node-{rank}", f"p{rank}", UID, rank, 0, phase, False, T0, exit_code=exit_code, finished=finished
        )

    job, _ = running_job()
    crashed = [
        process(0, "Running"),
        process(1, "Failed", 134, T0 + timedelta(seconds=2)),
        process(2, "Failed", 1, T0 + timedelta(seconds=1)),
    ]
    d = step(job, crashed, T0 + timedelta(seconds=3))
    assert [(f.rank, f.exit_code, f.reason) for f in d.status.failures or []] == [(2, 1, "Error")]
    d = step(with_progress(job), crashed, T0 + timedelta(seconds=3))
    assert cond(d, "Succeeded") == ("True", "CompletedBeforeFailure") and "node 2" in message_of(d, "Succeeded")


# --- the repeated-error rule ------------------------------------------------------------------


def raised(text: str, line: int = 5) -> str:
    """A shipped function's failure message (the torchrun agent's record of it)."""
    return (
        f"worker rank 0 (local rank 0, pid 4242) exited with code 1: {text}\nTraceback (most recent call last):\n"
        f'  File "/kubetrain/function/function.py", line {line}, in train\n    raise ValueError(message)\n{text}'
    )


def fail_twice(first: str, second: str, **spec: Any) -> Decision:
    """A job's attempts 0 and 1 each fail on node 0 with these messages: the decision on the second."""
    spec.setdefault("runPolicy", {"maxRestarts": 3})
    job, pods = running_job(**spec)
    job = advance(job, step(job, [pod_view(job, 0, phase="Failed", exit_code=1, message=first), *pods[1:]]))
    running = [pod_view(job, r, attempt=1, phase="Running") for r in range(3)]
    job = advance(job, step(job, running))
    running[0] = pod_view(job, 0, attempt=1, phase="Failed", exit_code=1, message=second)
    return step(job, running, T0 + timedelta(minutes=5))


def test_a_function_that_raises_the_same_error_twice_fails_without_a_restart() -> None:
    d = fail_twice(raised("ValueError: bad lr"), raised("ValueError: bad lr"), command=runner_command())
    assert d.status.phase == "Failed" and cond(d, "Failed") == ("True", "RepeatedError")
    assert d.status.restarts == 1 and [f.attempt for f in d.status.failures or []] == [0, 1]
    assert message_of(d, "Failed") == (
        "node 0 (pod j-node-0) failed with exit code 1 (Error): ValueError: bad lr; attempt 0 failed with the "
        "same error (ValueError: bad lr at /kubetrain/function/function.py:5): not restarted, a restart would "
        "raise it again (a failurePolicy rule with action RestartJob restarts it anyway)"
    )
    assert [e.reason for e in d.events] == ["RepeatedError"]


INIT_FAILED = "init container kubetrain-runtime exited 1: cp: cannot create '/kubetrain-runtime/x': Read-only"


@pytest.mark.parametrize(
    ("second", "fails"), [(INIT_FAILED, True), (INIT_FAILED.replace("exited 1", "exited 2"), False)]
)
def test_an_init_container_failing_the_same_way_twice_fails_any_job(second: str, fails: bool) -> None:
    spec = {"runPolicy": {"maxRestarts": 3}}
    job, pods = running_job(**spec)
    broken = pod_view(job, 0, phase="Failed", exit_code=1, reason="InitContainerFailed", message=INIT_FAILED)
    job = advance(job, step(job, [broken, *pods[1:]]))
    running = [pod_view(job, r, attempt=1, phase="Running") for r in range(3)]
    job = advance(job, step(job, running))
    running[0] = pod_view(job, 0, attempt=1, phase="Failed", exit_code=1, reason="InitContainerFailed", message=second)
    d = step(job, running, T0 + timedelta(minutes=5))
    if not fails:
        assert d.status.phase != "Failed" and d.status.restarts == 2
        return
    assert cond(d, "Failed") == ("True", "RepeatedError") and d.status.restarts == 1
    assert "attempt 0 failed the same way before its trainer started: not restarted" in message_of(d, "Failed")


@pytest.mark.parametrize(
    ("first", "second", "spec"),
    [
        # A different text or line: another error.
        (raised("ValueError: bad lr"), raised("ValueError: bad lr 0.1"), {"command": runner_command()}),
        (raised("ValueError: bad lr"), raised("ValueError: bad lr", line=6), {"command": runner_command()}),
        # A flaky error (a lost peer names another port each time), an error of the environment.
        (
            raised("RuntimeError: Connection closed by peer [10.0.0.7]:4311"),
            raised("RuntimeError: Connection closed by peer [10.0.0.7]:5120"),
            {"command": runner_command()},
        ),
        (
            raised("torch.distributed.DistStoreError: timed out"),
            raised("torch.distributed.DistStoreError: timed out"),
            {"command": runner_command()},
        ),
        # Not a shipped function: the built-in trainer, a script.
        (raised("ValueError: bad lr"), raised("ValueError: bad lr"), {}),
        (raised("ValueError: bad lr"), raised("ValueError: bad lr"), {"command": ["torchrun", "train.py"]}),
        # The user's failure policy says to restart it.
        (
            raised("ValueError: bad lr"),
            raised("ValueError: bad lr"),
            {
                "command": runner_command(),
                "runPolicy": {
                    "maxRestarts": 3,
                    "failurePolicy": {
                        "rules": [{"action": "RestartJob", "onExitCodes": {"operator": "In", "values": [1]}}]
                    },
                },
            },
        ),
    ],
)
def test_other_failures_of_two_attempts_in_a_row_restart(first: str, second: str, spec: dict[str, Any]) -> None:
    d = fail_twice(first, second, **spec)
    assert d.status.phase == "Restarting" and (d.status.attempt, d.status.restarts) == (2, 2)
