"""decide(): the in-place gang restart, its fallbacks to recreating the gang, and the timeline."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from support.decisions import advance, cond, make_job, message_of, step
from support.pods import T0, pod_view

from kubetrain.api.models import Timeline, TrainingJob
from kubetrain.api.records import GangFailure
from kubetrain.operator import timeline
from kubetrain.operator.conditions import get_condition
from kubetrain.operator.pods import PodView

pytestmark = pytest.mark.unit

FAILED_AT = T0 + timedelta(seconds=30, milliseconds=250)


def gang(**spec: Any) -> tuple[TrainingJob, list[PodView]]:
    """A 3-node job whose pods run attempt 0 with their agents Ready."""
    job = make_job(**spec)
    job = advance(job, step(job, [], service=False))
    pods = [pod_view(job, r, phase="Running", node=f"n{r}", ready=True) for r in range(3)]
    return advance(job, step(job, pods, T0 + timedelta(seconds=5))), pods


def holding(pods: list[PodView], *, node: int = 1, code: int = 137, attempt: int = 0) -> list[PodView]:
    """Every agent of the gang stopped and reported node `node`'s worker failure (NotReady)."""
    held = GangFailure(attempt, node, node, code, "Error", f"worker rank {node} exited with code {code}", FAILED_AT)
    return [replace(p, ready=False, held=held) for p in pods]


NOW = T0 + timedelta(seconds=31, milliseconds=400)


def test_a_held_worker_failure_restarts_the_gang_inside_its_pods() -> None:
    job, pods = gang()
    d = step(job, holding(pods), NOW)
    assert not d.delete_pods and not d.create_ranks, "no pod is deleted or created"
    assert sorted(d.restart_in_place) == sorted((p.name, p.uid) for p in pods)
    assert (d.status.attempt, d.status.restarts, d.status.uncounted_restarts) == (1, 1, 0)
    (failure,) = d.status.failures or []
    assert (failure.attempt, failure.rank, failure.pod, failure.node, failure.exit_code, failure.reason) == (
        0,
        1,
        "j-node-1",
        "n1",
        137,
        "Error",
    )
    assert failure.time == FAILED_AT and "worker rank 1 exited with code 137" in failure.message
    assert "restarting the whole gang in place as attempt 1 (restart 1 of 3)" in message_of(d, "Restarting")
    assert [e.reason for e in d.events] == ["GangRestart"]
    assert d.commit_first, "the decision is recorded before the pods are moved"
    line = d.status.timeline
    assert line is not None and (line.attempt, line.start, line.failed_at) == (1, "InPlace", FAILED_AT)
    assert line.detected_at == NOW, "the timeline keeps the millisecond"
    assert line.waiting_on.startswith("workers: the torchrun agents of node 0, 1, 2")
    assert d.requeue_after is not None and d.requeue_after <= 60, "the in-place deadline is watched"


def test_the_moved_pods_are_the_next_attempt_and_a_fixed_point() -> None:
    job, pods = gang()
    job = advance(job, step(job, holding(pods), NOW))
    moved = [pod_view(job, r, attempt=1, phase="Running", node=f"n{r}") for r in range(3)]
    d = step(job, moved, NOW + timedelta(seconds=1))
    assert not d.delete_pods and not d.create_ranks and not d.restart_in_place
    job = advance(job, d)
    again = step(job, moved, NOW + timedelta(seconds=2))
    assert again.status.wire() == job.status.wire() and not again.events  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("policy", "outcome", "reason"),
    [
        (
            {"failurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [137]}}]}},
            "Failed",
            "FailurePolicy",
        ),
        ({"maxRestarts": 0}, "Failed", "BackoffLimitExceeded"),
    ],
)
def test_a_fail_job_rule_or_an_exhausted_budget_fails_a_held_gang_at_once(
    policy: dict[str, Any], outcome: str, reason: str
) -> None:
    job, pods = gang(runPolicy=policy)
    d = step(job, holding(pods), NOW)
    assert cond(d, outcome) == ("True", reason) and not d.restart_in_place
    assert sorted(d.delete_pods) == sorted((p.name, p.uid) for p in pods), "cleanPodPolicy Running ends the agents"
    assert (d.status.failures or [])[0].exit_code == 137


def test_a_lost_pod_recreates_the_gang_even_when_its_agents_hold_a_failure() -> None:
    job, pods = gang()
    held = holding(pods)
    held[2] = pod_view(job, 2, phase="Failed", exit_code=137, node="n2", finished=T0 + timedelta(seconds=31))
    d = step(job, held, NOW)
    assert not d.restart_in_place and sorted(d.delete_pods) == sorted((p.name, p.uid) for p in pods)
    assert (d.status.failures or [])[0].rank == 2
    assert d.status.timeline is not None and d.status.timeline.start == "Recreate"


def test_a_deleted_pod_recreates_the_gang() -> None:
    job, pods = gang()
    held = holding(pods)
    held[0] = replace(held[0], terminating=True)
    d = step(job, held, NOW)
    assert not d.restart_in_place and len(d.delete_pods) == 2  # the terminating pod is going already
    assert (d.status.failures or [])[0].reason == "PodDeleted"


def test_restart_strategy_recreate_never_restarts_in_place() -> None:
    job, pods = gang(runPolicy={"restartStrategy": "Recreate"})
    d = step(job, holding(pods), NOW)
    assert not d.restart_in_place and len(d.delete_pods) == 3 and d.status.restarts == 1


def test_the_earliest_held_failure_is_blamed_then_the_lowest_node() -> None:
    job, pods = gang()
    early = GangFailure(0, 2, 2, 1, "Error", "x", FAILED_AT)
    late = GangFailure(0, 0, 0, 137, "Error", "y", FAILED_AT + timedelta(milliseconds=50))
    views = [replace(pods[0], ready=False, held=late), replace(pods[1], ready=False), replace(pods[2], held=early)]
    assert (step(job, views, NOW).status.failures or [])[0].rank == 2


def test_a_failure_held_for_an_earlier_attempt_is_not_acted_on() -> None:
    job, pods = gang()
    d = step(job, holding(pods, attempt=7), NOW)
    assert not d.restart_in_place and not d.delete_pods and not d.status.failures


def test_pods_still_labelled_with_the_attempt_before_are_moved_again() -> None:
    """Level-based: the status says attempt 1 restarted in place; pods of attempt 0 still run
    (the operator stopped before relabelling them, or the watch lags): moved, not deleted."""
    job, pods = gang()
    job = advance(job, step(job, holding(pods), NOW))
    d = step(job, pods, NOW + timedelta(seconds=1))
    assert sorted(d.restart_in_place) == sorted((p.name, p.uid) for p in pods) and not d.delete_pods


def test_an_in_place_attempt_that_does_not_rendezvous_in_time_is_recreated() -> None:
    job, pods = gang()
    job = advance(job, step(job, holding(pods), NOW))
    # Node 1's agent never restarted its workers (its pod stayed NotReady).
    moved = [pod_view(job, r, attempt=1, phase="Running", node=f"n{r}", ready=r != 1) for r in range(3)]
    waiting = step(job, moved, NOW + timedelta(seconds=59))
    assert not waiting.delete_pods and waiting.requeue_after == pytest.approx(1, abs=0.5)
    d = step(job, moved, NOW + timedelta(seconds=61))
    assert sorted(d.delete_pods) == sorted((p.name, p.uid) for p in moved) and not d.restart_in_place
    last = (d.status.failures or [])[-1]
    assert last.reason == "InPlaceRestartTimedOut" and "did not complete its rendezvous within 60 s" in last.message
    # It says where the attempt stood: the clue to why, on the status a user reads.
    assert "waiting on workers: the torchrun agents of node 1 have not restarted their workers" in last.message
    ready = [replace(p, ready=True) for p in moved]
    late = (step(job, ready, NOW + timedelta(seconds=61)).status.failures or [])[-1]
    assert "waiting on rendezvous: rank 0 has not joined its process group" in late.message, late.message
    assert message_of(d, "Restarting").startswith("attempt 1 failed (InPlaceRestartTimedOut): attempt 1, restarted")
    assert (d.status.attempt, d.status.restarts, d.status.uncounted_restarts) == (2, 1, 1), "not counted twice"
    assert d.status.timeline is not None and d.status.timeline.start == "Recreate"
    # A rendezvous in time: no fallback.
    assert job.status is not None and job.status.timeline is not None
    met = job.status.timeline.model_copy(update={"rendezvous_at": NOW + timedelta(seconds=1)})
    job = job.model_copy(update={"status": job.status.model_copy(update={"timeline": met})})
    assert not step(job, moved, NOW + timedelta(seconds=61)).delete_pods


def test_a_stalled_gang_restarts_in_place_when_every_agent_is_ready() -> None:
    job, pods = gang(runPolicy={"hangTimeoutSeconds": 60, "startupTimeoutSeconds": 60})
    d = step(job, pods, T0 + timedelta(seconds=70))
    assert cond(d, "Stalled") == ("True", "NoProgress")
    assert len(d.restart_in_place) == 3 and not d.delete_pods and d.status.restarts == 1
    # An agent that is not Ready (no kubetrain hooks in the image, or starting) cannot be told.
    unready = [pods[0], pods[1], replace(pods[2], ready=False)]
    d = step(job, unready, T0 + timedelta(seconds=70))
    assert not d.restart_in_place and len(d.delete_pods) == 3


# --- the timeline ---------------------------------------------------------------------------


def test_a_recreated_attempt_records_each_phase_and_what_it_waits_on() -> None:
    job, pods = gang()
    failed = [*pods[:2], pod_view(job, 2, phase="Failed", exit_code=1, node="n2", finished=T0 + timedelta(seconds=30))]
    job = advance(job, step(job, failed, T0 + timedelta(seconds=31)))
    job = advance(job, step(job, [], T0 + timedelta(seconds=32)))
    unbound = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available",
    }
    pending = [pod_view(job, r, attempt=1, created=T0 + timedelta(seconds=32), conditions=[unbound]) for r in range(3)]
    d = step(job, pending, T0 + timedelta(seconds=33))
    line = d.status.timeline
    assert line is not None and line.pods_created_at == T0 + timedelta(seconds=32)
    assert line.waiting_on == "scheduling: 3 of 3 pods not bound; node 0: 0/1 nodes are available"
    started = T0 + timedelta(seconds=35)
    running = [pod_view(job, r, attempt=1, phase="Running", node="n1", created=started) for r in range(3)]
    line = step(advance(job, d), running, T0 + timedelta(seconds=36)).status.timeline
    assert line is not None and line.containers_started_at == started
    assert line.waiting_on.startswith("rendezvous: rank 0 has not joined")


def test_phases_are_monotone_and_add_up_to_the_total() -> None:
    """API times have whole seconds and records do not: each time is clamped to the one before."""
    base = datetime(2026, 1, 1, 12, 0, 0)
    line = Timeline(
        attempt=1,
        start="Recreate",
        failed_at=base + timedelta(seconds=0.7),
        detected_at=base + timedelta(seconds=1.2),
        pods_created_at=base + timedelta(seconds=1),  # whole seconds: before detected_at
        pods_scheduled_at=base + timedelta(seconds=2),
        containers_started_at=base + timedelta(seconds=3),
        rendezvous_at=base + timedelta(seconds=6.4),
        first_step_at=base + timedelta(seconds=6.9),
    )
    settled = timeline.advance(line, [], 3)
    times = [getattr(settled, field) for field, _ in timeline.PHASES if getattr(settled, field) is not None]
    assert times == sorted(times) and settled.pods_created_at == settled.detected_at
    seconds = [float(part.rsplit(" ", 1)[1].rstrip("s")) for part in settled.phases.split(" = ")[0].split(", ")]
    assert sum(seconds) == pytest.approx(6.2, abs=0.051) and settled.phases.endswith("= 6.2s")
    assert timeline.seconds(settled) == pytest.approx(6.2)


def test_a_finished_job_waits_on_nothing() -> None:
    job, _ = gang()
    done = [pod_view(job, r, phase="Succeeded", exit_code=0, node="n1") for r in range(3)]
    d = step(job, done, T0 + timedelta(seconds=40))
    assert cond(d, "Succeeded") == ("True", "AllNodesSucceeded")
    assert d.status.timeline is not None and d.status.timeline.waiting_on == ""
    assert get_condition(d.status, "Restarting") is None
