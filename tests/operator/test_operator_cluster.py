"""The operator against the real control plane: `kubetrain operator` as a subprocess, the
kubelet played by FakeKubelet (pod status through the API) and a reaper that finishes pod
deletions as a kubelet would. Every wait has a deadline; nothing sleeps a fixed time."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from support.controlplane import ControlPlane
from support.kubelet import FakeKubelet
from support.objects import Cluster, condition, has_condition
from support.operator_process import OperatorProcess, assert_clean
from support.podlog import PodCreations
from support.waiting import wait_for

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob
from kubetrain.operator.render import render_pod
from kubetrain.operator.settings import RenderSettings

pytestmark = pytest.mark.cluster


def attempt_of(job: dict[str, Any]) -> int:
    return int((job.get("status") or {}).get("attempt", 0))


def env_entries(env: list[Any]) -> list[dict[str, Any]]:
    """A created container's env as the renderer writes it: a value, or where it comes from (the
    pod's IP, the in-place job's agent token Secret)."""
    entries: list[dict[str, Any]] = []
    for e in env:
        source = e.value_from
        if source is None:
            entries.append({"name": e.name, "value": e.value})
        elif source.field_ref is not None:
            entries.append({"name": e.name, "valueFrom": {"fieldRef": {"fieldPath": source.field_ref.field_path}}})
        else:
            ref = source.secret_key_ref
            secret = {"name": ref.name, "key": ref.key, "optional": ref.optional}
            entries.append({"name": e.name, "valueFrom": {"secretKeyRef": secret}})
    return entries


def test_three_node_job_has_one_service_and_three_pods_with_the_exact_contract(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    created = cluster.create_job("tri", nodes=3, env=[{"name": "EXTRA", "value": "1"}])
    job = cluster.wait_job("tri", has_condition("Created"), "Created")
    pods = cluster.wait_pods("tri", 3)
    (service,) = cluster.services("tri")
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses is True
    assert service.spec.selector == {naming.LABEL_JOB: "tri"}

    model = TrainingJob.model_validate(created)
    for rank, pod in enumerate(pods):
        expected = render_pod(model, cluster.namespace, created["metadata"]["uid"], rank, 0, RenderSettings())
        assert env_entries(pod.spec.containers[0].env) == expected["spec"]["containers"][0]["env"]
        assert pod.metadata.labels == expected["metadata"]["labels"]
        assert (pod.spec.hostname, pod.spec.subdomain) == (f"tri-node-{rank}", "tri")
        (owner,) = pod.metadata.owner_references
        assert owner.uid == created["metadata"]["uid"] and owner.controller is True
    status = job["status"]
    assert status["phase"] == "Pending" and status["attempt"] == 0 and status["observedGeneration"] == 1
    assert status["replicas"]["active"] == 3 and status["startTime"]
    cluster.wait_events("tri", "Created")
    assert [e.reason for e in cluster.events("tri")] == ["Created"]


def test_killing_the_operator_mid_reconcile_never_duplicates_or_restarts(
    cluster: Cluster, crds_installed: ControlPlane, namespace: str, tmp_path: Path, kube_api: Any
) -> None:
    """Ten SIGKILLs at random moments while jobs are being created and reconciled; prints how
    long the last start took to settle every job, and the pods each attempt got."""
    proc = OperatorProcess(crds_installed.kubeconfig, tmp_path / "operator.log", namespaces=namespace)
    rng = random.Random(7)
    names = [f"k{i}" for i in range(10)]
    first_uid: dict[str, str] = {}

    def no_pod_replaced() -> None:
        # Pod names are unique, so a duplicate or a restart shows as a pod deleted or
        # recreated under its name: every name keeps the uid it was first seen with.
        for p in cluster.core.list_namespaced_pod(namespace).items:
            name = p.metadata.name
            assert p.metadata.deletion_timestamp is None, f"{name} was deleted"
            assert first_uid.setdefault(name, p.metadata.uid) == p.metadata.uid, f"{name} was recreated"
            assert p.metadata.labels[naming.LABEL_ATTEMPT] == "0", f"{name} belongs to a later attempt"

    with PodCreations(kube_api, namespace) as created:
        for name in names:
            cluster.create_job(name, nodes=3)
            proc.start(wait=False)
            # Listing and taking over take about a second; kill somewhere around it.
            deadline = time.monotonic() + rng.uniform(0.8, 2.5)
            while time.monotonic() < deadline:
                no_pod_replaced()
                time.sleep(0.05)
            proc.kill()
        restarted = time.monotonic()
        proc.start()
        try:
            for name in names:
                job = cluster.wait_job(name, has_condition("Created"), "Created after the restarts")
                pods = cluster.wait_pods(name, 3, attempt=0)
                assert [p.metadata.name for p in pods] == [f"{name}-node-{r}" for r in range(3)]
                no_pod_replaced()
                assert job["status"]["attempt"] == 0 and job["status"]["restarts"] == 0
                assert not job["status"].get("failures")
                assert len(cluster.services(name)) == 1
            settled = time.monotonic() - restarted
        finally:
            proc.stop()
        per_attempt = {name: created.per_attempt(name) for name in names}
    assert all(counts == {0: 3} for counts in per_attempt.values()), per_attempt
    print(f"\n10 SIGKILLs mid-reconcile: the last start settled every job in {settled:.2f} s; {per_attempt}")
    assert_clean(proc.log())


def test_one_failed_pod_restarts_the_gang_until_the_backoff_limit(
    cluster: Cluster, operator: OperatorProcess, kubelet: FakeKubelet
) -> None:
    ns = cluster.namespace
    cluster.create_job("gang", nodes=3, runPolicy={"maxRestarts": 2})
    cluster.run_all(kubelet, "gang", 0, 3)
    cluster.wait_job("gang", lambda j: j.get("status", {}).get("phase") == "Running", "Running")
    first_uids = {p.metadata.uid for p in cluster.live_pods("gang")}

    kubelet.fail(ns, "gang-node-1", exit_code=137, reason="OOMKilled")
    job = cluster.wait_job("gang", has_condition("Restarting"), "Restarting")
    assert job["status"]["phase"] == "Restarting" and job["status"]["restarts"] == 1 and attempt_of(job) == 1
    (failure,) = job["status"]["failures"]
    assert failure["attempt"] == 0 and failure["rank"] == 1 and failure["pod"] == "gang-node-1"
    assert failure["exitCode"] == 137 and failure["reason"] == "OOMKilled" and failure["node"] == kubelet.node_name
    assert condition(job, "Running") is not None and condition(job, "Running")["status"] == "False"  # type: ignore[index]

    pods = cluster.wait_pods("gang", 3, attempt=1)
    assert not first_uids & {p.metadata.uid for p in pods}  # every pod is new, not just rank 1
    cluster.run_all(kubelet, "gang", 1, 3)
    job = cluster.wait_job("gang", has_condition("Running"), "Running again")
    assert condition(job, "Restarting")["status"] == "False"  # type: ignore[index]

    for attempt in (1, 2):
        if attempt == 2:
            cluster.run_all(kubelet, "gang", 2, 3)
            cluster.wait_job("gang", has_condition("Running"), "Running at attempt 2")
        kubelet.fail(ns, "gang-node-0", exit_code=1)
        if attempt == 1:
            cluster.wait_job("gang", lambda j: attempt_of(j) == 2, "attempt 2")
    job = cluster.wait_job("gang", has_condition("Failed", reason="BackoffLimitExceeded"), "BackoffLimitExceeded")
    assert job["status"]["phase"] == "Failed" and job["status"]["restarts"] == 2
    assert len(job["status"]["failures"]) == 3 and job["status"]["completionTime"]

    def nothing_running() -> bool:
        return all(p.status.phase in ("Succeeded", "Failed") for p in cluster.live_pods("gang"))

    wait_for(nothing_running, 30, "no pod of the failed job left running")
    cluster.wait_events("gang", "BackoffLimitExceeded")
    reasons = [e.reason for e in cluster.events("gang")]
    assert reasons.count("GangRestart") == 2 and "BackoffLimitExceeded" in reasons
    assert 'kubetrain_gang_restarts_total{reason="OOMKilled"} 1.0' in operator.metrics()


def test_success_when_every_node_exits_zero(cluster: Cluster, operator: OperatorProcess, kubelet: FakeKubelet) -> None:
    cluster.create_job("ok", nodes=2)
    cluster.run_all(kubelet, "ok", 0, 2)
    # Both Running first: otherwise the operator may see node 0 finished beside a node 1 it has
    # not yet seen running (the job never was Running), which is not what this test is about.
    cluster.wait_job("ok", has_condition("Running"), "Running")
    kubelet.succeed(cluster.namespace, "ok-node-0")
    cluster.wait_job("ok", lambda j: j["status"]["replicas"]["succeeded"] == 1, "one node done")
    assert cluster.job("ok")["status"]["phase"] == "Running"  # type: ignore[index]
    kubelet.succeed(cluster.namespace, "ok-node-1")
    job = cluster.wait_job("ok", has_condition("Succeeded", reason="AllNodesSucceeded"), "Succeeded")
    assert job["status"]["phase"] == "Succeeded" and job["status"]["completionTime"]
    # cleanPodPolicy Running: finished pods stay for `kubectl logs`. The operator counts a
    # delete as it sends it, right after the status write this test just saw.
    assert 'kubetrain_api_writes_total{verb="delete",resource="pods"}' not in operator.metrics()
    assert len(cluster.live_pods("ok")) == 2


def test_active_deadline_fails_and_deletes_the_pods(cluster: Cluster, operator: OperatorProcess) -> None:
    cluster.create_job("late", nodes=2, runPolicy={"activeDeadlineSeconds": 2})
    job = cluster.wait_job("late", has_condition("Failed", reason="DeadlineExceeded"), "DeadlineExceeded", 20)
    assert job["status"]["phase"] == "Failed"
    wait_for(lambda: not cluster.live_pods("late"), 20, "pods deleted after the deadline")


def test_scheduling_timeout_fails_with_the_schedulers_message(
    cluster: Cluster, operator: OperatorProcess, kubelet: FakeKubelet
) -> None:
    cluster.create_job("nofit", nodes=2, gpusPerNode=8, runPolicy={"schedulingTimeoutSeconds": 5})
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    # What kube-scheduler writes on a pod it cannot place (this control plane runs none).
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    for pod in cluster.wait_pods("nofit", 2):
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
        kubelet.patch_status(cluster.namespace, pod.metadata.name, {"conditions": [scheduled]})
    job = cluster.wait_job("nofit", has_condition("Failed", reason="Unschedulable"), "Unschedulable", 20)
    assert message in condition(job, "Failed")["message"]  # type: ignore[index]
    wait_for(lambda: not cluster.live_pods("nofit"), 20, "pending pods deleted")


def test_suspend_deletes_the_pods_and_resume_recreates_them(
    cluster: Cluster, operator: OperatorProcess, kubelet: FakeKubelet
) -> None:
    cluster.create_job("nap", nodes=2)
    cluster.run_all(kubelet, "nap", 0, 2)
    cluster.wait_job("nap", has_condition("Running"), "Running")
    cluster.patch_spec("nap", {"runPolicy": {"suspend": True}})
    job = cluster.wait_job("nap", has_condition("Suspended"), "Suspended")
    assert job["status"]["phase"] == "Suspended" and job["status"]["restarts"] == 0
    wait_for(lambda: not cluster.pods("nap"), 20, "pods deleted while suspended")

    cluster.patch_spec("nap", {"runPolicy": {"suspend": False}})
    job = cluster.wait_job("nap", has_condition("Suspended", "False", "Resumed"), "resumed")
    cluster.wait_pods("nap", 2, attempt=attempt_of(job))
    assert attempt_of(job) == 1 and job["status"]["restarts"] == 0
    cluster.run_all(kubelet, "nap", 1, 2)
    cluster.wait_job("nap", has_condition("Running"), "Running after resume")


def test_created_suspended_creates_nothing(cluster: Cluster, operator: OperatorProcess) -> None:
    """Kueue creates jobs suspended and admits them by unsuspending."""
    cluster.create_job("queued", nodes=2, runPolicy={"suspend": True})
    cluster.wait_job("queued", has_condition("Suspended"), "Suspended")
    assert not cluster.pods("queued") and not cluster.services("queued")
    cluster.patch_spec("queued", {"runPolicy": {"suspend": False}})
    cluster.wait_pods("queued", 2)


def test_ttl_and_delete_garbage_collect_the_children(
    cluster: Cluster, operator: OperatorProcess, kubelet: FakeKubelet
) -> None:
    cluster.create_job("ttl", nodes=2, runPolicy={"ttlSecondsAfterFinished": 1, "cleanPodPolicy": "None"})
    cluster.create_job("gone", nodes=2)
    for name in ("ttl", "gone"):
        cluster.wait_pods(name, 2)
    for rank in range(2):
        kubelet.succeed(cluster.namespace, f"ttl-node-{rank}")
    # Succeeded may last less than a poll (completionTime has 1 s resolution, the TTL is
    # 1 s): its Event, posted before the TTL runs out, outlives the job.
    wait_for(lambda: cluster.job("ttl") is None, 20, "the TTL deleting the finished job")
    assert "AllNodesSucceeded" in [e.reason for e in cluster.events("ttl")]
    cluster.delete_job("gone")

    # The garbage collector notices a new CRD's dependents only after its discovery refresh
    # (~30 s after the CRD appeared), then removes them in well under a second.
    def children_gone() -> bool:
        return not any(cluster.pods(n) or cluster.services(n) for n in ("ttl", "gone"))

    wait_for(children_gone, 90, "the children garbage-collected with their jobs")


def test_pods_pass_pod_security_restricted(cluster: Cluster, operator: OperatorProcess) -> None:
    """The namespace enforces the restricted Pod Security Standard: the server admits the pods."""
    cluster.enforce_pod_security("restricted")
    cluster.create_job("strict", nodes=2, gpusPerNode=1, backend="nccl")
    cluster.wait_job("strict", has_condition("Created"), "Created under enforce=restricted")
    assert len(cluster.wait_pods("strict", 2)) == 2


def test_a_pod_the_server_refuses_fails_the_job_with_its_message(cluster: Cluster, operator: OperatorProcess) -> None:
    # Valid for the TrainingJob schema (a label value of at most 63 characters), invalid for a pod.
    cluster.create_job("refused", nodes=2, nodeSelector={"pool": "not a label value!"})
    job = cluster.wait_job("refused", has_condition("Failed", reason="PodCreationFailed"), "PodCreationFailed")
    assert "nodeSelector" in condition(job, "Failed")["message"]  # type: ignore[index]
    assert job["status"]["phase"] == "Failed" and not condition(job, "Created")
    cluster.wait_events("refused", "PodCreationFailed", timeout=10)
