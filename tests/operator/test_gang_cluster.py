"""Gang scheduling on the real kube-scheduler (spec.scheduling.gang): its own control plane (1.37)
with the scheduler, the GenericWorkload gate and scheduling.k8s.io/v1beta1, and three fake Nodes of one
allocatable CPU each, so capacity is three one-CPU pods. The scheduler binds the pods; the
FakeKubelet only writes their status (Running, Succeeded)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from support import controlplane
from support.controlplane import ControlPlane
from support.kubelet import FakeKubelet, schedulable_node
from support.objects import Cluster, condition, has_condition, release_pods
from support.operator_process import OperatorProcess, running_operator
from support.podgroup_schemas import load, snapshot, source
from support.tools import control_plane
from support.waiting import wait_for

from kubetrain.api import naming
from kubetrain.operator import podgroup

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
NODES = ("slot-0", "slot-1", "slot-2")
ONE_CPU = {"requests": {"cpu": "1"}}
COSCHEDULING_CRD = Path(__file__).parent / "crds" / "scheduling.x-k8s.io_podgroups.yaml"


@pytest.fixture(scope="module")
def gang_plane() -> Iterator[ControlPlane]:
    """A control plane of this module's own (the session's has no scheduler), with the PodGroup
    API served and enforced, our CRD and scheduler-plugins' PodGroup CRD installed, and three
    one-CPU Nodes."""
    gates = dict.fromkeys(podgroup.FEATURE_GATES, True)
    with control_plane(
        scheduler=True, feature_gates=gates, runtime_config=[f"{podgroup.NATIVE_BETA.api_version}=true"]
    ) as cp:
        controlplane.install_crds(cp, ROOT / "crds")
        controlplane.install_crds(cp, COSCHEDULING_CRD)
        with cp.api_client() as api:
            for name in NODES:
                schedulable_node(client.CoreV1Api(api), name, cpu="1")
        yield cp


@pytest.fixture
def api(gang_plane: ControlPlane) -> Iterator[Any]:
    with gang_plane.api_client() as api:
        yield api


@pytest.fixture
def cluster(gang_plane: ControlPlane, api: Any) -> Iterator[Cluster]:
    """A fresh namespace; afterwards its pods are removed at once, so that the next test finds
    all three CPUs free (no kubelet confirms a graceful deletion here)."""
    core = client.CoreV1Api(api)
    name = f"gang-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: core.list_namespaced_service_account(name).items, 30, f"the default ServiceAccount in {name}")
    yield Cluster(api, name)
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    release_pods(core, name)
    wait_for(lambda: not core.list_namespaced_pod(name).items, 30, f"the pods of {name} gone")
    core.delete_namespace(name)


@pytest.fixture
def operator(gang_plane: ControlPlane, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    with running_operator(gang_plane.kubeconfig, tmp_path / "operator.log", cluster.namespace) as proc:
        yield proc


def bound(cluster: Cluster, job: str) -> list[str]:
    return [p.spec.node_name for p in cluster.live_pods(job) if p.spec.node_name]


def unschedulable(cluster: Cluster, job: str) -> dict[str, Any] | None:
    """The job's PodsScheduled condition once it says Unschedulable."""
    found = condition(cluster.job(job) or {}, "PodsScheduled")
    return found if found and found["status"] == "False" and found["reason"] == "Unschedulable" else None


def submit(cluster: Cluster, mode: str, *names: str, nodes: int = 2, **run_policy: Any) -> None:
    for name in names:
        cluster.create_job(
            name, nodes=nodes, resources=ONE_CPU, scheduling={"gang": mode}, runPolicy={"maxRestarts": 0, **run_policy}
        )


def test_native_gang_runs_one_job_whole_and_the_other_not_at_all(
    cluster: Cluster, operator: OperatorProcess, api: Any
) -> None:
    submit(cluster, "native", "a", "b")
    for job in ("a", "b"):
        cluster.wait_pods(job, 2, attempt=0)
    # The waiting job is told why; only then is "zero bound" a settled state, not a race.
    loser = wait_for(lambda: next((j for j in ("a", "b") if unschedulable(cluster, j)), None), 60, "a job waiting")
    winner = "b" if loser == "a" else "a"
    wait_for(lambda: len(bound(cluster, winner)) == 2, 30, f"both pods of {winner} bound")
    assert bound(cluster, loser) == []
    stored = stored_podgroup(api, cluster, f"{winner}-0")
    assert stored["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    # As written: 1.36 stored its default, Pod, unless the WorkloadAwarePreemption gate was on.
    assert stored["spec"]["disruptionMode"] == {"all": {}}
    assert [o["name"] for o in stored["metadata"]["ownerReferences"]] == [winner]
    for job in (winner, loser):
        assert podgroups(api, cluster, job) == [f"{job}-0"]
        assert {p.spec.scheduling_group.pod_group_name for p in cluster.live_pods(job)} == {f"{job}-0"}
        assert condition(cluster.job(job) or {}, podgroup.CONDITION)["reason"] == "PodGroup"  # type: ignore[index]

    kubelet = FakeKubelet(api)
    for pod in cluster.live_pods(winner):
        kubelet.run(cluster.namespace, pod.metadata.name)
    for pod in cluster.live_pods(winner):
        kubelet.succeed(cluster.namespace, pod.metadata.name)
    cluster.wait_job(winner, has_condition("Succeeded"), "Succeeded")
    # The winner's CPUs are free again: the other gang binds, all of it.
    wait_for(lambda: len(bound(cluster, loser)) == 2, 60, f"both pods of {loser} bound")
    cluster.wait_job(loser, has_condition("PodsScheduled", reason="AllPodsScheduled"), "PodsScheduled")


def test_without_gang_the_second_job_sits_half_placed_holding_a_cpu(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    submit(cluster, "none", "a", "b")
    half = wait_for(lambda: next((j for j in ("a", "b") if unschedulable(cluster, j)), None), 60, "a job waiting")
    whole = "b" if half == "a" else "a"
    wait_for(lambda: len(bound(cluster, whole)) == 2 and len(bound(cluster, half)) == 1, 30, "three pods bound")
    # Half of `half` holds the third CPU and can do nothing with it until `whole` ends: with
    # two such jobs each half-placed on a full cluster, neither ever would (the deadlock).
    assert condition(cluster.job(half) or {}, podgroup.CONDITION)["reason"] == "Disabled"  # type: ignore[index]
    assert [p.spec.scheduling_group for p in cluster.live_pods(half)] == [None, None]


RESERVED = "kubetrain.dev/reserved"


@contextlib.contextmanager
def two_slots_the_second_reserved(api: Any) -> Iterator[Callable[[], None]]:
    """slot-2 cordoned (capacity: two CPUs) and slot-1 tainted until the returned call lifts
    the taint; the nodes are restored afterwards for the module's other tests."""
    core = client.CoreV1Api(api)
    taint = {"key": RESERVED, "value": "b", "effect": "NoSchedule"}
    core.patch_node("slot-2", {"spec": {"unschedulable": True}})
    core.patch_node("slot-1", {"spec": {"taints": [taint]}})
    try:
        yield lambda: core.patch_node("slot-1", {"spec": {"taints": None}})
    finally:
        core.patch_node("slot-1", {"spec": {"taints": None}})
        core.patch_node("slot-2", {"spec": {"unschedulable": None}})


def settled(cluster: Cluster, job: str) -> bool:
    """Every unbound pod of `job` was turned down, for want of CPU and with the taint lifted. 1.37's
    scheduler tells one pod of a gang "minCount (2) cannot be satisfied" and the others why."""
    pending = [p for p in cluster.live_pods(job) if not p.spec.node_name]
    messages = [c.message or "" for p in pending for c in p.status.conditions or [] if c.type == "PodScheduled"]
    return (
        bool(pending)
        and len(messages) == len(pending)
        and any("Insufficient cpu" in m for m in messages)
        and not any("taint" in m for m in messages)
    )


@pytest.mark.parametrize("mode", ["none", "native"])
def test_two_jobs_arriving_interleaved_deadlock_without_the_gang(
    mode: str, cluster: Cluster, operator: OperatorProcess, api: Any
) -> None:
    # Two CPUs, two 2-node jobs whose pods arrive interleaved: a's first pod while only slot-0
    # is open, then b's (which alone tolerate slot-1's taint). The taint only orders the
    # arrivals, as a race between two submissions would; then it is lifted.
    with two_slots_the_second_reserved(api) as lift:
        submit(cluster, mode, "a")
        wait_for(lambda: unschedulable(cluster, "a"), 60, "a waiting for a second CPU")
        assert len(bound(cluster, "a")) == (1 if mode == "none" else 0)
        cluster.create_job(
            "b",
            nodes=2,
            resources=ONE_CPU,
            scheduling={"gang": mode},
            tolerations=[{"key": RESERVED, "operator": "Exists", "effect": "NoSchedule"}],
        )
        wait_for(lambda: len(bound(cluster, "b")) == (1 if mode == "none" else 2), 60, "b placed")
        lift()
        wait_for(lambda: settled(cluster, "a"), 60, "the scheduler seeing no CPU for a")
        if mode == "none":
            # Both half-placed on a full cluster: neither can ever start. The deadlock.
            assert settled(cluster, "b")
            assert (len(bound(cluster, "a")), len(bound(cluster, "b"))) == (1, 1)
            return
        assert bound(cluster, "a") == []  # a holds nothing while b runs
        kubelet = FakeKubelet(api)
        for pod in cluster.live_pods("b"):
            kubelet.run(cluster.namespace, pod.metadata.name)
            kubelet.succeed(cluster.namespace, pod.metadata.name)
        wait_for(lambda: len(bound(cluster, "a")) == 2, 60, "a placed whole once b finished")


def test_a_gang_larger_than_the_cluster_binds_nothing_and_fails_at_the_scheduling_timeout(
    cluster: Cluster, operator: OperatorProcess, api: Any
) -> None:
    submit(cluster, "native", "big", nodes=4, schedulingTimeoutSeconds=15)
    cluster.wait_pods("big", 4, attempt=0)

    def explained() -> bool:
        # The job quotes one pod's PodScheduled message: the scheduler's own words (they
        # change as it retries, so both are read again until they agree).
        waiting = unschedulable(cluster, "big")
        said = {
            f"pod {p.metadata.name}: {c.message}"
            for p in cluster.live_pods("big")
            for c in p.status.conditions or []
            if c.type == "PodScheduled" and c.reason == "Unschedulable"
        }
        return waiting is not None and waiting["message"] in said

    wait_for(explained, 60, "PodsScheduled=False (Unschedulable) with the scheduler's message")
    assert bound(cluster, "big") == []
    cluster.wait_events("big", "Unschedulable")
    job = cluster.wait_job("big", has_condition("Failed", reason="Unschedulable"), "Failed (Unschedulable)", 60)
    assert "schedulingTimeoutSeconds=15" in condition(job, "Failed")["message"]  # type: ignore[index]
    assert bound(cluster, "big") == []


def stored_podgroup(api: Any, cluster: Cluster, name: str) -> dict[str, Any]:
    native = podgroup.NATIVE_BETA
    found: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        native.group, native.version, cluster.namespace, native.plural, name
    )
    return found


def podgroups(api: Any, cluster: Cluster, job: str) -> list[str]:
    native, selector = podgroup.NATIVE_BETA, f"{naming.LABEL_JOB}={job}"
    found = client.CustomObjectsApi(api).list_namespaced_custom_object(
        native.group, native.version, cluster.namespace, native.plural, label_selector=selector
    )["items"]
    return sorted(g["metadata"]["name"] for g in found)


def test_a_gang_restart_replaces_the_attempts_podgroup(cluster: Cluster, operator: OperatorProcess, api: Any) -> None:
    submit(cluster, "native", "r")
    kubelet = FakeKubelet(api)
    wait_for(lambda: len(bound(cluster, "r")) == 2, 60, "both pods of r bound")
    for pod in cluster.live_pods("r"):
        kubelet.run(cluster.namespace, pod.metadata.name)
    cluster.patch_spec("r", {"runPolicy": {"maxRestarts": 1}})
    kubelet.fail(cluster.namespace, "r-node-1", exit_code=1)

    def replaced() -> bool:
        kubelet.confirm_deletions(cluster.namespace)  # the kubelet's half of deleting a bound pod
        return podgroups(api, cluster, "r") == ["r-1"]

    wait_for(replaced, 60, "PodGroup r-0 gone with attempt 0, r-1 in its place")
    pods = cluster.wait_pods("r", 2, attempt=1)
    assert {p.spec.scheduling_group.pod_group_name for p in pods} == {"r-1"}


def test_coscheduling_creates_the_scheduler_plugins_podgroup(
    cluster: Cluster, operator: OperatorProcess, api: Any
) -> None:
    # No scheduler runs the Coscheduling plugin here: the test reads what the API server
    # stored, and the pods wait for a scheduler that never comes.
    plugins = "scheduler-plugins-scheduler"
    cluster.create_job("c", nodes=2, resources=ONE_CPU, scheduling={"gang": "coscheduling"}, schedulerName=plugins)
    pods = cluster.wait_pods("c", 2, attempt=0)
    assert {(p.metadata.labels[podgroup.COSCHEDULING_LABEL], p.spec.scheduler_name) for p in pods} == {("c-0", plugins)}
    assert all(p.spec.scheduling_group is None for p in pods)
    stored = client.CustomObjectsApi(api).get_namespaced_custom_object(
        podgroup.COSCHEDULING.group,
        podgroup.COSCHEDULING.version,
        cluster.namespace,
        podgroup.COSCHEDULING.plural,
        "c-0",
    )
    assert stored["spec"]["minMember"] == 2
    assert [o["name"] for o in stored["metadata"]["ownerReferences"]] == ["c"]
    job = cluster.wait_job(
        "c", has_condition(podgroup.CONDITION, reason="Coscheduling"), "GangScheduling (Coscheduling)"
    )
    cluster.wait_events("c", "GangScheduling")
    assert condition(job, "PodsScheduled") is None  # no scheduler has looked at the pods


def test_the_vendored_podgroup_schema_is_the_one_this_apiserver_serves(gang_plane: ControlPlane) -> None:
    """The unit tests check rendered PodGroups against tests/operator/schemas/; the 1.37 one must be
    what this 1.37 apiserver serves (the 1.36 one was read the same way from a 1.36 apiserver)."""
    api_version = podgroup.NATIVE_BETA.api_version
    served = json.loads(gang_plane.kubectl("get", "--raw", source(api_version)).stdout)
    assert snapshot(served, controlplane.pinned("K8S_VERSION"), api_version) == load(api_version), (
        "run tests/cluster/vendor_podgroup_schemas.py"
    )


@contextlib.contextmanager
def cordoned(api: Any, *nodes: str) -> Iterator[Callable[[str], None]]:
    """`nodes` cordoned until the returned call opens one; all restored afterwards."""
    core = client.CoreV1Api(api)
    for name in nodes:
        core.patch_node(name, {"spec": {"unschedulable": True}})
    try:
        yield lambda name: core.patch_node(name, {"spec": {"unschedulable": None}})
    finally:
        for name in nodes:
            core.patch_node(name, {"spec": {"unschedulable": None}})


def test_an_elastic_gang_is_placed_minimum_first_then_pod_by_pod(
    cluster: Cluster, operator: OperatorProcess, api: Any
) -> None:
    """Range 2-3 with one CPU free: its quorum (node 0 and node 1) holds nothing until two fit, and
    binds together; node 2 then binds alone once a CPU opens, the group's quorum being met."""
    with cordoned(api, "slot-1", "slot-2") as uncordon:
        cluster.create_job("e", nodes=3, resources=ONE_CPU, elastic={"minNodes": 2}, command=["python", "train.py"])
        wait_for(lambda: unschedulable(cluster, "e"), 60, "e waiting for a second CPU")
        assert sorted(p.metadata.name for p in cluster.live_pods("e")) == ["e-node-0", "e-node-1"]
        assert bound(cluster, "e") == [], "without its quorum the gang holds no CPU"
        stored = stored_podgroup(api, cluster, "e-elastic")
        assert stored["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
        assert naming.LABEL_ATTEMPT not in stored["metadata"]["labels"]
        uncordon("slot-1")
        wait_for(lambda: len(bound(cluster, "e")) == 2, 60, "nodes 0 and 1 bound together")
        pods = cluster.wait_pods("e", 3, attempt=0)
        assert {p.spec.scheduling_group.pod_group_name for p in pods} == {"e-elastic"}
        wait_for(lambda: settled(cluster, "e"), 60, "node 2 waiting for a CPU")
        uncordon("slot-2")
        wait_for(lambda: len(bound(cluster, "e")) == 3, 60, "node 2 bound alone")
    gang = condition(cluster.job("e") or {}, podgroup.CONDITION)
    assert gang is not None and gang["reason"] == "PodGroup" and "minCount 2" in gang["message"]


def test_lowering_min_nodes_lets_a_waiting_elastic_gang_bind_its_smaller_quorum(
    cluster: Cluster, operator: OperatorProcess, api: Any
) -> None:
    """1.37's v1beta1 PodGroup has a mutable minCount: range 3-3 on two free CPUs binds nothing;
    lowered to 2-3, the operator patches the live group's minCount to 2 and the scheduler binds
    two pods (a v1alpha2 group would keep its quorum of 3 and bind none)."""
    with cordoned(api, "slot-2"):
        cluster.create_job("m", nodes=3, resources=ONE_CPU, elastic={"minNodes": 3}, command=["python", "train.py"])
        cluster.wait_pods("m", 3, attempt=0)
        wait_for(lambda: unschedulable(cluster, "m"), 60, "m waiting for a third CPU")
        assert bound(cluster, "m") == [], "a quorum of 3 on 2 CPUs binds nothing"
        assert stored_podgroup(api, cluster, "m-elastic")["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
        cluster.patch_spec("m", {"elastic": {"minNodes": 2}})
        wait_for(
            lambda: stored_podgroup(api, cluster, "m-elastic")["spec"]["schedulingPolicy"]["gang"]["minCount"] == 2,
            30,
            "the PodGroup's minCount patched to 2",
        )
        wait_for(lambda: len(bound(cluster, "m")) == 2, 120, "two pods bound on the two free CPUs")
    gang = condition(cluster.job("m") or {}, podgroup.CONDITION)
    assert gang is not None, cluster.job("m")
    assert "v1beta1 PodGroup" in gang["message"] and "it follows spec.elastic.minNodes" in gang["message"]
