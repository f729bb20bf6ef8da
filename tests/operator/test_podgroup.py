"""spec.scheduling.gang: the mode each job gets (operator/podgroup.py), the PodGroup it renders, and
how decide() records the choice and the scheduler's Unschedulable message."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from support.decisions import advance, cond, step
from support.jobs import job_model
from support.pods import JOB_UID as UID
from support.pods import T0, pod_view

from kubetrain.api.models import TrainingJob
from kubetrain.operator import podgroup
from kubetrain.operator.conditions import get_condition
from kubetrain.operator.decision import Policy
from kubetrain.operator.render import owner_reference
from kubetrain.operator.status import decide

pytestmark = pytest.mark.unit

NATIVE, NONE = "native", "none"


SERVED = frozenset({"scheduling.k8s.io/v1alpha2"})  # Kubernetes 1.36
BETA = frozenset({"scheduling.k8s.io/v1beta1"})  # 1.37
COSCHEDULING = frozenset({"scheduling.x-k8s.io/v1alpha1"})
NOTHING: frozenset[str] = frozenset()
# The operator's policy once it asked the API server which group APIs it serves (or before).
ON_SERVED, ON_NOTHING, NOT_ASKED = Policy(group_apis=SERVED), Policy(group_apis=NOTHING), Policy(group_apis=None)
PLUGINS = "scheduler-plugins-scheduler"


@pytest.mark.parametrize(
    ("asked", "scheduler", "served", "mode", "reason"),
    [
        ("auto", None, SERVED, NATIVE, "PodGroup"),
        ("auto", "default-scheduler", SERVED, NATIVE, "PodGroup"),
        ("auto", "volcano", SERVED, NONE, "OtherScheduler"),
        ("auto", None, NOTHING, NONE, "NotServed"),
        ("auto", PLUGINS, COSCHEDULING, NONE, "NotServed"),  # coscheduling only when asked for
        ("native", None, SERVED, NATIVE, "PodGroup"),
        ("native", "volcano", SERVED, NATIVE, "PodGroup"),  # asked for explicitly: the user's call
        ("native", None, COSCHEDULING, None, "GangSchedulingUnavailable"),
        ("coscheduling", PLUGINS, COSCHEDULING, "coscheduling", "Coscheduling"),
        ("coscheduling", None, SERVED | COSCHEDULING, "coscheduling", "Coscheduling"),
        ("coscheduling", PLUGINS, SERVED, None, "GangSchedulingUnavailable"),
        ("none", None, SERVED, NONE, "Disabled"),
        ("none", None, NOTHING, NONE, "Disabled"),
        ("auto", None, BETA, NATIVE, "PodGroup"),
        ("native", None, BETA | SERVED, NATIVE, "PodGroup"),
    ],
)
def test_choose(asked: str, scheduler: str | None, served: frozenset[str], mode: str | None, reason: str) -> None:
    spec = job_model("j", scheduling={"gang": asked}, schedulerName=scheduler).spec
    choice = podgroup.choose(spec, served)
    assert (choice.mode, choice.reason) == (mode, reason)


def test_the_missing_api_is_named_with_its_feature_gates() -> None:
    message = podgroup.choose(job_model("j", scheduling={"gang": "native"}).spec, NOTHING).message
    assert "neither scheduling.k8s.io/v1beta1 nor scheduling.k8s.io/v1alpha2 PodGroup is served" in message
    assert "--runtime-config=scheduling.k8s.io/v1beta1=true, or scheduling.k8s.io/v1alpha2=true before" in message
    assert "feature gate GenericWorkload=true, GenericWorkload=true,GangScheduling=true before 1.37" in message


def test_the_default_is_auto() -> None:
    assert job_model("j").spec.scheduling.gang == "auto"


@pytest.mark.parametrize(
    ("served", "version"),
    [
        (SERVED, "scheduling.k8s.io/v1alpha2"),
        (BETA, "scheduling.k8s.io/v1beta1"),
        (SERVED | BETA, "scheduling.k8s.io/v1beta1"),  # 1.37 may serve both: its beta first
        (COSCHEDULING, None),
    ],
)
def test_the_native_podgroup_is_written_in_the_newest_version_served(served: frozenset[str], version: str) -> None:
    api = podgroup.served_api("native", served)
    assert (api.api_version if api else None) == version


def test_render_podgroup() -> None:
    job = job_model("j", nodes=4)
    assert podgroup.render_podgroup(job, "ns", UID, 3, podgroup.NATIVE_ALPHA) == {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {
            "name": "j-3",
            "namespace": "ns",
            "labels": {
                "kubetrain.dev/job-name": "j",
                "kubetrain.dev/job-uid": UID,
                "kubetrain.dev/attempt": "3",
                "app.kubernetes.io/managed-by": "kubetrain-operator",
            },
            "ownerReferences": [owner_reference(job, UID)],  # test_render.py reads this one
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}, "disruptionMode": "PodGroup"},
    }
    assert podgroup.stale_selector(UID, 3) == f"kubetrain.dev/job-uid={UID},kubetrain.dev/attempt!=3"


def test_render_coscheduling_podgroup() -> None:
    group = podgroup.render_podgroup(job_model("j", nodes=4), "ns", UID, 0, podgroup.COSCHEDULING)
    assert (group["apiVersion"], group["metadata"]["name"], group["spec"]) == (
        "scheduling.x-k8s.io/v1alpha1",
        "j-0",
        {"minMember": 4},
    )


@pytest.mark.parametrize(
    ("status", "reason", "mode"),
    [
        ("True", "PodGroup", NATIVE),
        ("True", "Coscheduling", "coscheduling"),
        ("False", "NotServed", NONE),
        ("True", "SomeFutureKind", NONE),
    ],
)
def test_the_condition_names_the_attempts_mode(status: str, reason: str, mode: str) -> None:
    assert podgroup.attempt_mode(status, reason) == mode


def test_join_leaves_the_rendered_pod_untouched() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": []}}
    joined = podgroup.join(pod, "j-0", "native")
    assert joined["spec"] == {"containers": [], "schedulingGroup": {"podGroupName": "j-0"}}
    labelled = podgroup.join(pod, "j-0", "coscheduling")
    assert labelled["metadata"] == {"name": "p", "labels": {"scheduling.x-k8s.io/pod-group": "j-0"}}
    assert labelled["spec"] == {"containers": []}
    assert pod == {"metadata": {"name": "p"}, "spec": {"containers": []}}


def make_job(**spec: Any) -> TrainingJob:
    spec.setdefault("nodes", 2)
    job = job_model("j", **spec)
    job.metadata.uid, job.metadata.generation = UID, 1
    return job


def test_a_new_attempt_records_its_mode_and_the_gang_announces_itself() -> None:
    d = step(make_job(), policy=ON_SERVED)
    assert cond(d, podgroup.CONDITION) == ("True", "PodGroup") and d.create_ranks == [0, 1]
    assert [e.reason for e in d.events] == [podgroup.CONDITION, "Created"]
    fallback = step(make_job(), policy=ON_NOTHING)
    assert cond(fallback, podgroup.CONDITION) == ("False", "NotServed") and fallback.create_ranks == [0, 1]
    assert [e.reason for e in fallback.events] == ["Created"]  # the condition says it; no Event


def test_the_mode_is_kept_while_the_attempt_has_pods() -> None:
    job = advance(make_job(), step(make_job(), policy=ON_SERVED))
    pods = [pod_view(job, r) for r in range(2)]
    # Discovery changed its answer mid-attempt: the pods already joined their PodGroup.
    assert cond(step(job, pods, policy=ON_NOTHING), podgroup.CONDITION) == ("True", "PodGroup")


def test_the_decision_carries_the_attempts_mode_and_the_api_served_now() -> None:
    first = step(make_job(), policy=ON_SERVED)
    assert (first.gang_mode, first.group_api) == (NATIVE, podgroup.NATIVE_ALPHA)
    job = advance(make_job(), first)
    pods = [pod_view(job, r) for r in range(2)]
    upgraded = step(job, pods, policy=Policy(group_apis=BETA | SERVED))  # 1.37: the same object, in v1beta1
    assert (upgraded.gang_mode, upgraded.group_api) == (NATIVE, podgroup.NATIVE_BETA)
    gone = step(job, pods, policy=ON_NOTHING)  # its first version, which the API server refuses
    assert (gone.gang_mode, gone.group_api) == (NATIVE, podgroup.NATIVE_BETA)
    local = step(make_job(), policy=NOT_ASKED)
    assert (local.gang_mode, local.group_api) == (NONE, None)


def test_the_local_runner_has_no_scheduler_to_ask() -> None:
    assert cond(step(make_job(), policy=NOT_ASKED), podgroup.CONDITION) is None


def test_native_where_the_api_is_not_served_fails_the_job_before_any_pod() -> None:
    d = step(make_job(scheduling={"gang": "native"}), policy=ON_NOTHING)
    assert cond(d, "Failed") == ("True", "GangSchedulingUnavailable") and d.create_ranks == []
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "GangSchedulingUnavailable")]


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient cpu.",
}


def test_unschedulable_pods_are_explained_with_the_schedulers_message() -> None:
    job = advance(make_job(), step(make_job(), policy=ON_SERVED))
    waiting = [pod_view(job, r, conditions=[UNSCHEDULABLE]) for r in range(2)]
    d = step(job, waiting, policy=ON_SERVED)
    condition = get_condition(d.status, "PodsScheduled")
    assert condition is not None and (condition.status, condition.reason) == ("False", "Unschedulable")
    assert condition.message == "pod j-node-0: 0/3 nodes are available: 3 Insufficient cpu."
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "Unschedulable")]
    job = advance(job, d)
    assert step(job, waiting, policy=ON_SERVED).events == []  # still waiting: one Event, not one per pass
    placed = [pod_view(job, r, node="n1") for r in range(2)]
    assert cond(step(job, placed, policy=ON_SERVED), "PodsScheduled") == ("True", "AllPodsScheduled")


def test_the_scheduling_timeout_still_fails_an_unplaceable_gang() -> None:
    job = make_job(runPolicy={"schedulingTimeoutSeconds": 60})
    job = advance(job, step(job, policy=ON_SERVED))
    waiting = [pod_view(job, r, conditions=[UNSCHEDULABLE]) for r in range(2)]
    d = decide(job, UID, waiting, True, T0 + timedelta(seconds=61), Policy(group_apis=SERVED))
    assert cond(d, "Failed") == ("True", "Unschedulable")


def test_a_job_never_unschedulable_gets_no_pods_scheduled_condition() -> None:
    job = advance(make_job(), step(make_job(), policy=ON_SERVED))
    assert cond(step(job, [pod_view(job, r, node="n1") for r in range(2)], policy=ON_SERVED), "PodsScheduled") is None


def test_the_scheduling_group_is_the_operators_not_the_templates() -> None:
    with pytest.raises(ValueError, match=r"spec\.template\.spec\.schedulingGroup"):
        job_model("j", template={"spec": {"schedulingGroup": {"podGroupName": "elsewhere"}}})
