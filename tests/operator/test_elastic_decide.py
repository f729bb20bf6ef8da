"""decide() for an elastic gang (spec.elastic, operator/elastic.py): the first gang formed from the
pods that can run, a lost node shrinking it in place without budget, waiting below the minimum,
growing back after the cool-down, and success judged on the gang's own members."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from support.decisions import advance, cond, make_job, step
from support.pods import JOB_UID, T0, pod_view

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob
from kubetrain.operator import elastic, podgroup
from kubetrain.operator.decision import Policy
from kubetrain.operator.pods import PodView
from kubetrain.operator.status import decide

pytestmark = pytest.mark.unit

ELASTIC = {"minNodes": 2, "scaleUpCooldownSeconds": 60}


def elastic_job(**elastic: Any) -> TrainingJob:
    return make_job(elastic={**ELASTIC, **elastic}, training={"globalBatchSize": 48})


def formed(ready: tuple[int, ...] = (0, 1, 2), **elastic: Any) -> tuple[TrainingJob, list[PodView]]:
    """An elastic 1-3 job whose pods of attempt 0 are up: those in `ready` on standby (Ready), the
    others Pending, waiting for a node; then the pass that forms the gang, and its first step."""
    job = elastic_job(**elastic)
    first = step(job, [], service=False)
    assert first.create_ranks == [0] and first.status.members == [] and first.status.size == 0
    job = advance(job, first)
    pods = [
        pod_view(job, r, phase="Running", node=f"n{r}", ready=True) if r in ready else pod_view(job, r)
        for r in range(3)
    ]
    d = step(job, pods, T0 + timedelta(seconds=5))
    job = advance(job, d)
    moved = [replace(p, attempt=1, ready=p.rank in ready) for p in pods]
    status = job.status
    assert status is not None and status.timeline is not None
    status.timeline.rendezvous_at = T0 + timedelta(seconds=7)
    status.timeline.first_step_at = T0 + timedelta(seconds=8)
    return job, moved


def test_node_0s_pod_takes_the_first_capacity() -> None:
    job = elastic_job()
    first = step(job, [], service=False)
    job = advance(job, first)
    d = step(job, [pod_view(job, 0)], T0 + timedelta(seconds=1))
    assert d.create_ranks == [], "node 0's pod waits for a node: the others are not created yet"
    d = step(job, [pod_view(job, 0, node="n0")], T0 + timedelta(seconds=2))
    assert d.create_ranks == [1, 2]


def test_an_elastic_job_trains_with_no_one_until_its_pods_are_on_standby() -> None:
    job = advance(elastic_job(), step(elastic_job(), [], service=False))
    starting = [pod_view(job, r, phase="Running", node=f"n{r}") for r in range(3)]
    d = step(job, starting, T0 + timedelta(seconds=2))
    assert not d.restart_in_place and d.status.attempt == 0 and d.status.members == []
    assert d.status.timeline is not None and d.status.timeline.waiting_on.startswith("waiting for nodes: 0 of 3")
    assert cond(d, "Running") != ("True", "AllPodsRunning")


def test_the_first_gang_is_every_pod_that_can_run() -> None:
    job = advance(elastic_job(), step(elastic_job(), [], service=False))
    pods = [pod_view(job, r, phase="Running", node=f"n{r}", ready=True) for r in range(3)]
    d = step(job, pods, T0 + timedelta(seconds=5))
    assert (d.status.attempt, d.status.members, d.status.size) == (1, [0, 1, 2], 3)
    assert sorted(d.restart_in_place) == sorted((p.name, p.uid) for p in pods)
    assert (d.status.restarts, d.status.uncounted_restarts) == (0, 0)
    (resize,) = d.status.resizes or []
    assert (resize.attempt, resize.from_size, resize.to_size, resize.reason) == (1, 0, 3, "GangFormed")


def test_with_capacity_for_two_the_gang_is_two_and_the_third_waits() -> None:
    job, pods = formed(ready=(0, 1))
    status = job.status
    assert status is not None and (status.attempt, status.members, status.size) == (1, [0, 1], 2)
    d = step(job, pods, T0 + timedelta(seconds=9))
    assert not d.restart_in_place and not d.create_ranks and d.status.members == [0, 1]


def test_a_pod_still_starting_is_waited_for_before_the_first_gang() -> None:
    job = advance(elastic_job(), step(elastic_job(), [], service=False))
    pods = [pod_view(job, r, phase="Running", node=f"n{r}", ready=r < 2) for r in range(3)]
    assert step(job, pods, T0 + timedelta(seconds=5)).status.members == []


@pytest.mark.parametrize("how", ["deleted", "failed", "vanished"])
def test_a_lost_node_shrinks_the_gang_in_place_without_budget(how: str) -> None:
    job, pods = formed()
    lost_at = T0 + timedelta(seconds=20)
    if how == "deleted":
        lost = replace(pods[1], terminating=True)
        observed = [pods[0], lost, pods[2]]
    elif how == "failed":
        lost = pod_view(job, 1, 1, "Failed", exit_code=137, finished=lost_at, node="n1")
        observed = [pods[0], lost, pods[2]]
    else:
        job = advance(job, step(job, pods, T0 + timedelta(seconds=10)))  # every pod seen once
        observed = [pods[0], pods[2]]
    d = step(job, observed, lost_at + timedelta(seconds=1))
    assert (d.status.attempt, d.status.members, d.status.size) == (2, [0, 2], 2)
    assert (d.status.restarts, d.status.uncounted_restarts) == (0, 0), "a resize spends no budget"
    assert sorted(d.restart_in_place) == sorted((p.name, p.uid) for p in (pods[0], pods[2]))
    resize = (d.status.resizes or [])[-1]
    assert (resize.from_size, resize.to_size, resize.attempt) == (3, 2, 2) and resize.reason.startswith("NodeLost")
    assert [e.reason for e in d.events] == ["Resized"] and "trains on at 2 of 2-3 nodes" in d.events[0].message
    assert d.commit_first
    line = d.status.timeline
    assert line is not None and (line.attempt, line.start) == (2, "InPlace")
    assert d.status.phase == "Restarting" and cond(d, "Restarting") == ("True", "Resizing")
    job = advance(job, d)
    moved = [replace(p, attempt=2, ready=True) for p in (pods[0], pods[2])]
    again = step(job, moved, lost_at + timedelta(seconds=3))
    assert again.status.phase == "Running" and cond(again, "Restarting") == ("False", "AllPodsRunning")


def test_the_lost_node_is_created_again_on_standby() -> None:
    job, pods = formed()
    lost = pod_view(job, 1, 1, "Failed", exit_code=137, finished=T0 + timedelta(seconds=20))
    job = advance(job, step(job, [pods[0], lost, pods[2]], T0 + timedelta(seconds=21)))
    moved = [replace(pods[0], attempt=2), replace(pods[2], attempt=2)]
    d = step(job, [*moved, lost], T0 + timedelta(seconds=22))
    assert d.delete_pods == [(lost.name, lost.uid)] and not d.create_ranks
    d = step(job, moved, T0 + timedelta(seconds=23))
    assert d.create_ranks == [1] and d.status.members == [0, 2]


def test_losing_node_0_recreates_the_gang_as_a_fixed_one_would() -> None:
    job, pods = formed()
    lost = pod_view(job, 0, 1, "Failed", exit_code=137, finished=T0 + timedelta(seconds=20))
    d = step(job, [lost, pods[1], pods[2]], T0 + timedelta(seconds=21))
    assert d.status.restarts == 1 and not d.restart_in_place
    assert d.status.members == [] and cond(d, "Restarting") == ("True", "Error")


def test_below_the_minimum_the_job_waits_without_budget_and_forms_again() -> None:
    job, pods = formed(ready=(0, 1))
    lost = pod_view(job, 1, 1, "Failed", exit_code=137, finished=T0 + timedelta(seconds=20))
    d = step(job, [pods[0], lost, pods[2]], T0 + timedelta(seconds=21))
    assert (d.status.attempt, d.status.members, d.status.restarts, d.status.uncounted_restarts) == (2, [], 0, 0)
    assert cond(d, "BelowMinNodes") == ("True", "WaitingForNodes")
    assert "fewer than elastic.minNodes 2" in (d.status.resizes or [])[-1].message
    job = advance(job, d)
    # Capacity back: node 1's new pod and node 2's run on standby with node 0's.
    standby = [
        replace(pods[0], attempt=2),
        pod_view(job, 1, 2, "Running", ready=True, node="n1"),
        replace(pods[2], attempt=2, phase="Running", ready=True, node="n2"),
    ]
    d = step(job, standby, T0 + timedelta(seconds=40))
    assert (d.status.attempt, d.status.members) == (3, [0, 1, 2])
    assert cond(d, "BelowMinNodes") == ("False", "EnoughNodes") and d.status.restarts == 0


def test_the_gang_grows_once_the_cool_down_passed() -> None:
    job, pods = formed(ready=(0, 1))
    ready = [pods[0], pods[1], replace(pods[2], phase="Running", ready=True, node="n2")]
    early = step(job, ready, T0 + timedelta(seconds=30))
    assert not early.restart_in_place and early.requeue_after is not None and early.requeue_after <= 35
    d = step(job, ready, T0 + timedelta(seconds=66))
    assert (d.status.attempt, d.status.members, d.status.size) == (2, [0, 1, 2], 3)
    assert sorted(d.restart_in_place) == sorted((p.name, p.uid) for p in ready)
    resize = (d.status.resizes or [])[-1]
    assert (resize.from_size, resize.to_size, resize.reason) == (2, 3, "CapacityReturned")
    assert d.status.restarts == 0
    assert d.status.phase == "Restarting" and cond(d, "Restarting") == ("True", "Resizing")


def test_success_is_the_gangs_own_and_the_standby_pod_is_cleaned_up() -> None:
    job, pods = formed(ready=(0, 1))
    done = [replace(p, phase="Succeeded", exit_code=0) for p in pods[:2]]
    d = step(job, [*done, replace(pods[2], phase="Running", node="n2")], T0 + timedelta(seconds=50))
    assert cond(d, "Succeeded") == ("True", "AllNodesSucceeded")
    assert d.delete_pods == [(pods[2].name, pods[2].uid)]


def test_a_standby_pod_that_fails_is_replaced_without_a_failure() -> None:
    job, pods = formed(ready=(0, 1))
    failed = pod_view(job, 2, 1, "Failed", exit_code=1, finished=T0 + timedelta(seconds=20))
    d = step(job, [pods[0], pods[1], failed], T0 + timedelta(seconds=21))
    assert d.delete_pods == [(failed.name, failed.uid)] and not d.status.failures
    assert d.status.attempt == 1 and d.status.restarts == 0


def test_a_standby_pod_that_keeps_failing_is_created_again_after_a_growing_back_off() -> None:
    """A pod that can only fail (a bad image on that node, say) is not deleted and created on every
    pass: 10 s after its first failure in a row, 20 s after its second, and so on."""
    job, pods = formed(ready=(0, 1))
    gang = [pods[0], pods[1]]
    at = T0 + timedelta(seconds=20)
    for count, wait in [(1, 10), (2, 20), (3, 40)]:
        failed = replace(
            pod_view(job, 2, 1, "Failed", exit_code=1, message="Traceback\nImportError: bad", finished=at),
            uid=f"pod-2-try-{count}",
        )
        d = step(job, [*gang, failed], at)
        assert d.delete_pods == [(failed.name, failed.uid)] and d.create_ranks == []
        (event,) = [e for e in d.events if e.reason == "StandbyPodFailed"]
        assert "ImportError: bad" in event.message
        assert f"created again in {wait} s (failure {count} in a row)" in event.message
        job = advance(job, d)
        # Seen again before its deletion is: counted once.
        again = step(job, [*gang, failed], at + timedelta(seconds=1))
        assert not [e for e in again.events if e.reason == "StandbyPodFailed"]
        (entry,) = again.status.standby_failures or []
        assert (entry.node, entry.count) == (2, count)
        # Gone: not created before its back-off ends, and the pass asks to be run again then.
        d = step(job, gang, at + timedelta(seconds=wait - 1))
        assert d.create_ranks == [] and d.requeue_after is not None and d.requeue_after <= 1
        assert (d.status.attempt, d.status.restarts, d.status.failures) == (1, 0, None)
        assert step(job, gang, at + timedelta(seconds=wait)).create_ranks == [2]
        at += timedelta(seconds=wait + 5)


def test_the_back_off_of_a_node_ends_once_it_joins_a_gang() -> None:
    job, pods = formed(ready=(0, 1))
    failed = pod_view(job, 2, 1, "Failed", exit_code=1, finished=T0 + timedelta(seconds=20))
    job = advance(job, step(job, [pods[0], pods[1], failed], T0 + timedelta(seconds=21)))
    assert [(e.node, e.count) for e in job.status.standby_failures or []] == [(2, 1)]  # type: ignore[union-attr]
    # Created again, it comes up on standby, and the gang grows to take it.
    back = pod_view(job, 2, 1, "Running", node="n2", ready=True)
    grown = step(job, [pods[0], pods[1], back], T0 + timedelta(seconds=90))
    assert grown.status.members == [0, 1, 2]
    job = advance(job, grown)
    after = step(job, [replace(p, attempt=2) for p in (pods[0], pods[1], back)], T0 + timedelta(seconds=91))
    assert after.status.standby_failures is None


def test_the_back_off_doubles_up_to_five_minutes() -> None:
    assert [elastic.standby_backoff(n).total_seconds() for n in (1, 2, 3, 5, 6, 40)] == [10, 20, 40, 160, 300, 300]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"nodes": 2, "elastic": {"minNodes": 3}, "command": ["x"]}, r"elastic.minNodes: 3 is more than nodes \(2\)"),
        (
            {"nodes": 3, "elastic": {"minNodes": 1}, "command": ["x"], "runPolicy": {"restartStrategy": "Recreate"}},
            "restartStrategy must be InPlace",
        ),
        ({"nodes": 3, "elastic": {"minNodes": 1}}, "needs training.globalBatchSize"),
    ],
)
def test_an_elastic_spec_that_cannot_work_is_refused_naming_the_field(spec: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        make_job(**spec)


def test_an_elastic_pod_carries_its_attempts_members_beside_its_attempt() -> None:
    from kubetrain.operator.render import render_pod

    job = make_job(
        elastic=ELASTIC,
        command=["python", "train.py"],
        template={"metadata": {"annotations": {"kubetrain.dev/members": "mine", "team": "a"}}},
    )
    pod = render_pod(job, "ns", "uid", 2, 5, members=[0, 1])
    assert pod["metadata"]["annotations"] == {"kubetrain.dev/members": "5:0,1", "team": "a"}, "kubetrain's wins"
    (volume,) = [v for v in pod["spec"]["volumes"] if "downwardAPI" in v]
    paths = {item["path"]: item["fieldRef"]["fieldPath"] for item in volume["downwardAPI"]["items"]}
    assert paths == {
        "attempt": "metadata.labels['kubetrain.dev/attempt']",
        "members": "metadata.annotations['kubetrain.dev/members']",
    }
    fixed = render_pod(make_job(command=["python", "train.py"]), "ns", "uid", 2, 5)
    assert "annotations" not in fixed["metadata"], "a gang of a fixed size gets no annotation"


ALPHA, BETA = frozenset({"scheduling.k8s.io/v1alpha2"}), frozenset({"scheduling.k8s.io/v1beta1"})


@pytest.mark.parametrize(("served", "says"), [(BETA, "it follows spec.elastic.minNodes"), (ALPHA, "fixed while")])
def test_an_elastic_gang_gets_one_podgroup_whose_quorum_is_its_minimum(served: frozenset[str], says: str) -> None:
    choice = podgroup.choose(elastic_job().spec, served)
    assert (choice.mode, choice.reason) == ("native", "PodGroup") and says in choice.message
    assert "minCount 2" in choice.message
    api = podgroup.served_api("native", served)
    assert api is not None
    job = elastic_job()
    group = podgroup.render_podgroup(job, "ns", "uid", 4, api)
    assert group["metadata"]["name"] == "j-elastic" == podgroup.podgroup_name(job, 9), "one for the job's life"
    assert naming.LABEL_ATTEMPT not in group["metadata"]["labels"], "no stale-attempt sweep may take it"
    # Losing one pod only shrinks an elastic gang: the default disruption mode, one pod at a time.
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 2}}}
    assert podgroup.min_count_patch(elastic_job(minNodes=1)) == {
        "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}
    }


def test_coscheduling_is_refused_for_an_elastic_job_and_native_is_not() -> None:
    with pytest.raises(ValidationError, match=r"scheduling\.gang coscheduling"):
        make_job(elastic=ELASTIC, command=["x"], scheduling={"gang": "coscheduling"})
    make_job(elastic=ELASTIC, command=["x"], scheduling={"gang": "native"})


def grouped(**elastic: Any) -> TrainingJob:
    """An elastic 2-3 job after its first pass on a cluster that serves the v1beta1 PodGroup."""
    job = elastic_job(**elastic)
    first = step(job, [], service=False, policy=Policy(group_apis=BETA))
    assert cond(first, podgroup.CONDITION) == ("True", "PodGroup")
    assert first.create_ranks == [0, 1], "the quorum first: node 0 and the rest of minNodes"
    return advance(job, first)


def test_with_a_podgroup_the_quorum_is_created_first_and_the_rest_once_it_is_placed() -> None:
    job, policy = grouped(), Policy(group_apis=BETA)
    waiting = [pod_view(job, 0, node="n0"), pod_view(job, 1)]
    assert step(job, waiting, T0 + timedelta(seconds=1), policy=policy).create_ranks == []
    placed = [pod_view(job, r, node=f"n{r}") for r in (0, 1)]
    assert step(job, placed, T0 + timedelta(seconds=2), policy=policy).create_ranks == [2]


def test_kueue_partial_admission_caps_the_pods_an_elastic_job_creates() -> None:
    job, policy = grouped(), Policy(group_apis=BETA)
    placed = [pod_view(job, r, node=f"n{r}") for r in (0, 1)]
    d = decide(job, JOB_UID, placed, True, T0 + timedelta(seconds=2), policy, admitted=2)
    assert d.create_ranks == [], "Kueue admitted 2 of 3: no pod for node 2"
    assert d.status.timeline is not None and d.status.timeline.waiting_on.endswith("Kueue admitted 2 of them")
    ready = [pod_view(job, r, phase="Running", node=f"n{r}", ready=True) for r in (0, 1)]
    d = decide(job, JOB_UID, ready, True, T0 + timedelta(seconds=5), policy, admitted=2)
    assert (d.status.members, d.status.size) == ([0, 1], 2), "the gang forms at the admitted size"


def test_an_elastic_job_waiting_for_its_first_gang_says_why_its_pods_are_not_placed() -> None:
    job, policy = grouped(), Policy(group_apis=BETA)
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "pod group is unschedulable, waiting for minCount pods",
    }
    pods = [pod_view(job, r, conditions=[unschedulable]) for r in (0, 1)]
    d = step(job, pods, T0 + timedelta(seconds=3), policy=policy)
    assert cond(d, "PodsScheduled") == ("False", "Unschedulable")
    assert d.status.members == [], "still waiting for its quorum"
