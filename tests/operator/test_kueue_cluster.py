"""Kueue admission with the real Kueue controller (tests/support/kueue.py) on a control plane of
this module's own, the operator running as the chart's ServiceAccount: a ClusterQueue with
quota for one 2-node job decides which TrainingJob runs; the operator creates the Workloads,
holds the jobs Kueue has not admitted, places the admitted ones on their flavor, hands back the
quota of a preempted one and marks finished ones Finished. Pods "run" through the FakeKubelet."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from support import kueue as kueue_support
from support import tools
from support.controlplane import ControlPlane, Unavailable
from support.kubelet import FakeKubelet
from support.objects import Cluster, condition, has_condition
from support.operator_process import OperatorProcess, running_operator
from support.tools import RELEASE_NAMESPACE, chart_identity, missing_tool
from support.waiting import wait_for

from kubetrain.api import naming
from kubetrain.operator import kueue

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

POOL_LABEL = "example.com/pool"
TOLERATION = {"key": "example.com/batch", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's control plane, with Kueue running against it (and replacing the session's
    for the fixtures that build on `control_plane`: namespace, cluster, kubelet)."""
    try:
        kueue_support.find_kueue()
    except Unavailable as exc:
        missing_tool(str(exc))
    with tools.control_plane() as cp, kueue_support.running(cp):
        yield cp


@pytest.fixture(scope="module")
def operator(crds_installed: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator as the chart's ServiceAccount (cluster mode): the chart's RBAC must cover
    everything Kueue admission makes it do."""
    workdir = tmp_path_factory.mktemp("operator")
    crds_installed.kubectl("create", "namespace", RELEASE_NAMESPACE)
    kubeconfig = chart_identity(crds_installed, RELEASE_NAMESPACE, workdir / "sa.kubeconfig")
    with running_operator(kubeconfig, workdir / "operator.log", log_level="debug") as proc:
        yield proc


class KueueObjects:
    """Kueue's objects for one test: a flavor, a ClusterQueue with `cpu` of quota, a LocalQueue."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.suffix = uuid.uuid4().hex[:6]

    def create(self, plural: str, kind: str, name: str, spec: dict[str, Any], namespaced: bool = False) -> str:
        body = {"apiVersion": kueue.API_VERSION, "kind": kind, "metadata": {"name": name}, **spec}
        if namespaced:
            self.custom.create_namespaced_custom_object(kueue.GROUP, kueue.VERSION, self.namespace, plural, body)
        else:
            self.custom.create_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, body)
        return name

    def queue(self, cpu: int, preemption: dict[str, str] | None = None) -> str:
        flavor = self.create(
            "resourceflavors",
            "ResourceFlavor",
            f"pool-a-{self.suffix}",
            {"spec": {"nodeLabels": {POOL_LABEL: "a"}, "tolerations": [TOLERATION]}},
        )
        quota = [{"name": flavor, "resources": [{"name": "cpu", "nominalQuota": cpu}]}]
        group = {"coveredResources": ["cpu"], "flavors": quota}
        spec: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": [group]}
        if preemption:
            spec["preemption"] = preemption
        cq = self.create("clusterqueues", "ClusterQueue", f"cq-{self.suffix}", {"spec": spec})
        return self.create("localqueues", "LocalQueue", "team", {"spec": {"clusterQueue": cq}}, namespaced=True)

    def priority(self, name: str, value: int) -> str:
        kind = "WorkloadPriorityClass"
        return self.create("workloadpriorityclasses", kind, f"{name}-{self.suffix}", {"value": value})

    def flavor(self) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_cluster_custom_object(
            kueue.GROUP, kueue.VERSION, "resourceflavors", f"pool-a-{self.suffix}"
        )
        return found

    def workload(self, job: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, self.namespace, "workloads", kueue.workload_name(job)
        )
        return found


@pytest.fixture
def objects(kube_api: Any, cluster: Cluster) -> KueueObjects:
    return KueueObjects(kube_api, cluster.namespace)


def create_job(cluster: Cluster, name: str, queue: str, priority: str | None = None) -> None:
    labels = {kueue.QUEUE_LABEL: queue, **({kueue.PRIORITY_LABEL: priority} if priority else {})}
    body = {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodes": 2,
            "image": "kubetrain/trainer:test",
            "resources": {"requests": {"cpu": "1"}},
            "checkpoint": {"dir": "/checkpoints", "volume": {"persistentVolumeClaim": {"claimName": "ck"}}},
        },
    }
    cluster.custom.create_namespaced_custom_object(naming.GROUP, naming.VERSION, cluster.namespace, naming.PLURAL, body)


def run_gang(cluster: Cluster, kubelet: FakeKubelet, job: str, attempt: int) -> list[Any]:
    pods = cluster.wait_pods(job, 2, attempt=attempt)
    for pod in pods:
        kubelet.run(cluster.namespace, pod.metadata.name)
    cluster.wait_job(job, has_condition("Running"), f"{job} Running")
    return pods


def finish_gang(cluster: Cluster, kubelet: FakeKubelet, job: str) -> dict[str, Any]:
    for rank in range(2):
        kubelet.succeed(cluster.namespace, naming.pod_name(job, rank))
    return cluster.wait_job(job, has_condition("Succeeded"), f"{job} Succeeded")


def restarts(status: dict[str, Any]) -> tuple[int, int, int]:
    """(attempt, restarts, uncountedRestarts)"""
    return status["attempt"], status["restarts"], status["uncountedRestarts"]


def waiting_for_admission(job: dict[str, Any]) -> bool:
    suspended = condition(job, "Suspended") or {}
    return suspended.get("status") == "True" and suspended.get("reason") == "WaitingForAdmission"


def test_one_job_runs_on_its_flavor_the_other_waits_in_the_queue_then_runs(
    operator: OperatorProcess, cluster: Cluster, kubelet: FakeKubelet, objects: KueueObjects
) -> None:
    queue = objects.queue(cpu=2)
    # Kueue's mutating webhook, called on loopback, added its finalizer.
    assert "kueue.x-k8s.io/resource-in-use" in objects.flavor()["metadata"]["finalizers"]
    create_job(cluster, "first", queue)
    first_pods = cluster.wait_pods("first", 2, attempt=0)
    create_job(cluster, "second", queue)

    second = cluster.wait_job("second", waiting_for_admission, "second held while first has the quota")
    message = condition(second, "Suspended")["message"]
    assert f"LocalQueue {queue}" in message and kueue.workload_name("second") in message, message
    assert cluster.pods("second") == []
    workload = objects.workload("first")
    assert workload["spec"]["podSets"][0]["count"] == 2
    assert workload["metadata"]["ownerReferences"][0]["kind"] == naming.KIND
    for pod in first_pods:  # the admitted flavor's node labels and tolerations
        assert pod.spec.node_selector == {POOL_LABEL: "a"}
        # (the apiserver's DefaultTolerationSeconds adds its not-ready/unreachable ones)
        assert TOLERATION in client.ApiClient().sanitize_for_serialization(pod.spec.tolerations)

    run_gang(cluster, kubelet, "first", 0)
    assert waiting_for_admission(cluster.job("second") or {})
    finish_gang(cluster, kubelet, "first")
    finished = condition(wait_for(lambda: objects.workload("first"), 30, "first's Workload"), "Finished")
    wait_for(
        lambda: (condition(objects.workload("first"), "Finished") or {}).get("status") == "True",
        30,
        f"first's Workload Finished (was {finished})",
    )

    run_gang(cluster, kubelet, "second", 0)
    done = finish_gang(cluster, kubelet, "second")["status"]
    assert restarts(done) == (0, 0, 0)


def test_a_preempted_job_suspends_and_resumes_from_its_checkpoint_uncharged(
    operator: OperatorProcess, cluster: Cluster, kubelet: FakeKubelet, objects: KueueObjects
) -> None:
    queue = objects.queue(cpu=2, preemption={"withinClusterQueue": "LowerPriority"})
    low, high = objects.priority("low", 100), objects.priority("high", 1000)
    create_job(cluster, "low", queue, low)
    first = run_gang(cluster, kubelet, "low", 0)
    assert objects.workload("low")["spec"]["priority"] == 100

    create_job(cluster, "high", queue, high)
    evicted = cluster.wait_job(
        "low", has_condition("Suspended", reason="EvictedPreempted"), "low suspended by the preemption", 60
    )
    assert "Preempted" in condition(evicted, "Suspended")["message"]
    run_gang(cluster, kubelet, "high", 0)
    workload = objects.workload("low")
    assert (condition(workload, "Requeued") or {}).get("status") == "True", workload["status"]
    assert "admission" not in workload["status"]
    low_status = (cluster.job("low") or {})["status"]
    assert restarts(low_status) == (1, 0, 1)
    assert cluster.live_pods("low") == []

    finish_gang(cluster, kubelet, "high")
    resumed = run_gang(cluster, kubelet, "low", 1)
    # The new attempt mounts the same checkpoint claim and directory: the trainer resumes the
    # newest complete checkpoint it finds there (tests/operator/test_operator_resume.py).
    assert [volumes_and_env(p) for p in resumed] == [volumes_and_env(p) for p in first]
    done = finish_gang(cluster, kubelet, "low")["status"]
    assert restarts(done) == (1, 0, 1)


def test_suspending_a_queued_job_frees_its_quota_for_the_next(
    operator: OperatorProcess, cluster: Cluster, kubelet: FakeKubelet, objects: KueueObjects
) -> None:
    queue = objects.queue(cpu=2)
    create_job(cluster, "paused", queue)
    run_gang(cluster, kubelet, "paused", 0)
    create_job(cluster, "next", queue)
    cluster.wait_job("next", waiting_for_admission, "next held while paused has the quota")

    cluster.patch_spec("paused", {"runPolicy": {"suspend": True}})
    run_gang(cluster, kubelet, "next", 0)  # the deactivated Workload's quota went to it
    workload = objects.workload("paused")
    assert workload["spec"]["active"] is False and "admission" not in workload["status"]
    assert (condition(workload, "Requeued") or {}).get("status") == "False"  # not requeued while inactive

    cluster.patch_spec("paused", {"runPolicy": {"suspend": False}})
    wait_for(lambda: objects.workload("paused")["spec"].get("active") is True, 30, "paused's Workload active again")
    finish_gang(cluster, kubelet, "next")
    run_gang(cluster, kubelet, "paused", 1)
    done = finish_gang(cluster, kubelet, "paused")["status"]
    assert restarts(done) == (1, 0, 0)


def volumes_and_env(pod: Any) -> tuple[Any, ...]:
    claims = sorted(v.persistent_volume_claim.claim_name for v in pod.spec.volumes if v.persistent_volume_claim)
    env = {e.name: e.value for e in pod.spec.containers[0].env or []}
    return tuple(claims), env.get("KUBETRAIN_CHECKPOINT_DIR")


def test_an_elastic_job_is_admitted_partially_and_creates_no_pod_beyond_it(
    operator: OperatorProcess, cluster: Cluster, kubelet: FakeKubelet, objects: KueueObjects
) -> None:
    """Quota for two one-CPU pods, a job of range 2-3: Kueue's partial admission admits 2 (the pod
    set's minCount is minNodes), and the gang forms at 2 with no pod for node 2."""
    queue = objects.queue(cpu=2)
    body = {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": "elastic", "labels": {kueue.QUEUE_LABEL: queue}},
        "spec": {
            "nodes": 3,
            "elastic": {"minNodes": 2},
            "image": "kubetrain/trainer:test",
            "command": ["python", "train.py"],
            "resources": {"requests": {"cpu": "1"}},
        },
    }
    cluster.custom.create_namespaced_custom_object(naming.GROUP, naming.VERSION, cluster.namespace, naming.PLURAL, body)

    def created() -> dict[str, Any] | None:
        try:
            return objects.workload("elastic")
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    (pod_set,) = wait_for(created, 30, "the Workload")["spec"]["podSets"]
    assert (pod_set["count"], pod_set["minCount"]) == (3, 2)

    def admitted() -> int | None:
        status = objects.workload("elastic").get("status") or {}
        assignments = (status.get("admission") or {}).get("podSetAssignments") or [{}]
        count: int | None = assignments[0].get("count")
        return count

    assert wait_for(admitted, 60, "Kueue's admission") == 2
    # Node 0 first (no PodGroup here), then node 1 once node 0 runs; node 2 never.
    kubelet.run(cluster.namespace, cluster.wait_pods("elastic", 1, attempt=0)[0].metadata.name)
    pods = cluster.wait_pods("elastic", 2, attempt=0)
    kubelet.run(cluster.namespace, "elastic-node-1")
    job = cluster.wait_job("elastic", lambda j: (j.get("status") or {}).get("size") == 2, "the gang formed at 2")
    assert sorted(p.metadata.name for p in pods) == ["elastic-node-0", "elastic-node-1"]
    assert sorted(p.metadata.name for p in cluster.live_pods("elastic")) == ["elastic-node-0", "elastic-node-1"]
    assert job["status"]["members"] == [0, 1] and job["status"]["restarts"] == 0
