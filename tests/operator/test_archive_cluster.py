"""Logs that outlive their pods, on the real control plane: the operator as a process, the pods
run as local processes by the process node (support.processnode), their logs read through
`pods/log`. A failed attempt's traceback is still printed by `kubetrain logs --attempt 0` after
the gang restart and cleanPodPolicy: All deleted every pod; no pod is ever left held by the
finalizer (a job deleted mid-run included); an operator killed between keeping a log and
releasing its pod redoes the release and keeps what it kept."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from support.controlplane import ControlPlane, free_port, service_account_kubeconfig
from support.objects import Cluster, has_condition
from support.operator_process import OperatorProcess
from support.processnode import ProcessNode
from support.tools import NAMESPACED_RULES
from support.waiting import wait_for

from kubetrain.api import naming
from kubetrain.api.records import records_in

pytestmark = pytest.mark.cluster

KUBETRAIN = Path(sys.executable).with_name("kubetrain")
# Node 1 prints a traceback and exits 1; node 0 runs until it is stopped.
CRASHING = (
    "import os, time\n"
    "print('node', os.environ['NODE_RANK'], 'up', flush=True)\n"
    "if os.environ['NODE_RANK'] == '1':\n"
    "    raise ValueError('boom from rank 1')\n"
    "time.sleep(600)\n"
)


# Each node says so on SIGTERM, 3 s later (the time its trainer would take to checkpoint); node 0
# also logs the checkpoint record it "wrote".
STOPPING = textwrap.dedent(
    """
    import json, os, signal, sys, time
    rank = os.environ['NODE_RANK']
    print('node', rank, 'up', flush=True)
    def stop(signum, frame):
        time.sleep(3)
        if rank == '0':
            record = {'event': 'checkpoint', 'time': time.time(), 'step': 7, 'path': '/ck/step-7'}
            print(json.dumps({**record, 'reason': 'signal'}), flush=True)
        print('node', rank, 'checkpointed on SIGTERM', flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    time.sleep(600)
    """
)


def logs(cp: ControlPlane, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubetrain logs` as a user runs it."""
    command = [str(KUBETRAIN), "logs", *args, "-n", namespace, "--kubeconfig", str(cp.kubeconfig)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def archive(cluster: Cluster, job: str, attempt: int) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = cluster.core.read_namespaced_config_map(
            naming.log_archive_name(job, attempt), cluster.namespace
        ).to_dict()
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


def no_pods_left(cluster: Cluster, job: str, timeout: float) -> None:
    def gone() -> bool:
        return not cluster.pods(job)

    try:
        wait_for(gone, timeout, f"every pod of {job} deleted")
    except Exception as error:
        held = [(p.metadata.name, p.metadata.finalizers, p.metadata.deletion_timestamp) for p in cluster.pods(job)]
        raise AssertionError(f"pods of {job} left: {held}") from error


@pytest.mark.slow
def test_after_a_gang_restart_and_cleanup_the_failed_attempts_traceback_is_printed(
    crds_installed: ControlPlane, cluster: Cluster, operator: OperatorProcess, process_node: ProcessNode
) -> None:
    """The real trainer: rank 1 raises at step 15 of attempt 0 (KUBETRAIN_FAULT, once per job),
    the gang restarts and succeeds, cleanPodPolicy All deletes the last pods."""
    job = cluster.create_job(
        "traceback",
        nodes=2,
        masterPort=free_port(),  # every pod shares the node's loopback
        training={
            "dataset": "synthetic",
            "syntheticSamples": 4096,
            "epochs": 1,
            "maxSteps": 40,
            "batchSize": 32,
            "logEverySteps": 5,
        },
        checkpoint={"dir": "/checkpoints", "everySteps": 10, "volume": {"persistentVolumeClaim": {"claimName": "ck"}}},
        env=[{"name": "KUBETRAIN_FAULT", "value": "raise,rank=1,step=15"}],
        runPolicy={"maxRestarts": 1, "cleanPodPolicy": "All"},
    )
    done = cluster.wait_job("traceback", has_condition("Succeeded"), "Succeeded after one gang restart", 420)
    assert (done["status"]["attempt"], done["status"]["restarts"]) == (1, 1), done["status"]
    no_pods_left(cluster, "traceback", 60)

    failed = logs(crds_installed, cluster.namespace, "traceback", "--attempt", "0")
    assert failed.returncode == 0, failed.stderr
    lines = failed.stdout.splitlines()
    assert "[node-1] Traceback (most recent call last):" in lines, lines[-40:]
    assert any(line.startswith("[node-1] ") and "InjectedFault" in line for line in lines), lines[-40:]
    assert {line.split(" ", 1)[0] for line in lines} == {"[node-0]", "[node-1]"}
    last = logs(crds_installed, cluster.namespace, "traceback", "--attempt", "1", "--rank", "0")
    assert last.returncode == 0, last.stderr
    records = records_in("\n".join(line.removeprefix("[node-0] ") for line in last.stdout.splitlines()))
    assert records and records[-1]["event"] == "done", last.stdout[-2000:]

    # The archives belong to the job: garbage-collected with it.
    for attempt in (0, 1):
        kept = archive(cluster, "traceback", attempt)
        assert kept is not None
        (owner,) = kept["metadata"]["owner_references"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainingJob", job["metadata"]["uid"], True)
        assert sorted(kept["data"]) == ["node-0.log", "node-1.log"]


@pytest.mark.parametrize("propagation", ["Background", "Foreground"])
def test_a_job_deleted_mid_run_leaves_no_pod_held(
    cluster: Cluster, operator: OperatorProcess, process_node: ProcessNode, propagation: str
) -> None:
    cluster.create_job("doomed", nodes=2, command=[sys.executable, "-c", "import time; time.sleep(600)"])
    cluster.wait_job("doomed", has_condition("Running"), "Running", 60)
    cluster.custom.delete_namespaced_custom_object(
        naming.GROUP, naming.VERSION, cluster.namespace, naming.PLURAL, "doomed", propagation_policy=propagation
    )
    # The garbage collector deletes the pods (a CRD's dependents after its ~30 s discovery refresh).
    no_pods_left(cluster, "doomed", 120)
    wait_for(lambda: cluster.job("doomed") is None, 60, "the job gone")
    selector = f"{naming.LABEL_JOB}=doomed"
    assert cluster.core.list_namespaced_config_map(cluster.namespace, label_selector=selector).items == []


def restricted_kubeconfig(cp: ControlPlane, namespace: str, path: Path) -> Path:
    """The operator's namespaced Role without `patch pods`: it keeps logs but can never release
    a pod, which holds it between the two by construction."""
    rules = [
        {
            "apiGroups": [group],
            "resources": [resource],
            "verbs": [v for v in verbs if (resource, v) != ("pods", "patch")],
        }
        for group, resource, verbs in NAMESPACED_RULES
    ]
    meta = {"name": "no-release", "namespace": namespace}
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-release"},
            "subjects": [{"kind": "ServiceAccount", "name": "no-release", "namespace": namespace}],
        },
    ]
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    return service_account_kubeconfig(cp, namespace, "no-release", path)


def test_an_operator_killed_between_keeping_a_log_and_releasing_its_pod_recovers(
    crds_installed: ControlPlane, cluster: Cluster, process_node: ProcessNode, tmp_path: Path
) -> None:
    ns = cluster.namespace
    kubeconfig = restricted_kubeconfig(crds_installed, ns, tmp_path / "no-release.kubeconfig")
    first = OperatorProcess(kubeconfig, tmp_path / "first.log", namespaces=ns).start()
    try:
        cluster.create_job(
            "held",
            nodes=2,
            command=[sys.executable, "-c", CRASHING],
            runPolicy={"maxRestarts": 1, "cleanPodPolicy": "All"},
        )

        seen: list[Any] = []

        def kept_and_held() -> bool:
            found = archive(cluster, "held", 0) or {}
            data = found.get("data") or {}
            pods = cluster.pods("held")
            held = [(p.metadata.name, p.metadata.deletion_timestamp, p.metadata.finalizers) for p in pods]
            seen[:] = [data, held]
            stuck = len(pods) == 2 and all(when and naming.LOG_FINALIZER in (held or []) for _, when, held in held)
            return "boom from rank 1" in data.get("node-1.log", "") and "node-0.log" in data and stuck

        try:
            wait_for(kept_and_held, 90, "attempt 0's logs kept, its pods still held")
        except AssertionError as error:
            raise AssertionError(f"{error}; last seen: {seen}") from None
    finally:
        first.kill()
    kept = (archive(cluster, "held", 0) or {})["data"]
    assert "forbidden" in first.log(), first.log()[-3000:]
    # Meanwhile the kubelet removed node 1's container, and its log with it.
    (process_node.workdir / "pods" / ns / "held-node-1" / "trainer.log").unlink()

    second = OperatorProcess(crds_installed.kubeconfig, tmp_path / "second.log", namespaces=ns).start()
    try:
        # Attempt 1 runs (its node 1 fails again: maxRestarts 1 is exceeded), then cleanPodPolicy.
        cluster.wait_job("held", has_condition("Failed"), "Failed after attempt 1", 90)
        no_pods_left(cluster, "held", 60)
    finally:
        second.stop()
    assert "Traceback" not in second.log(), second.log()[-3000:]
    assert (archive(cluster, "held", 0) or {})["data"] == kept  # redone, and nothing lost
    again = logs(crds_installed, ns, "held", "--attempt", "0", "--rank", "1")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == "[node-1] ValueError: boom from rank 1"
    assert "[node-1] Traceback (most recent call last):" in again.stdout


def test_the_last_lines_of_a_pod_stopped_by_a_gang_restart_outlive_its_container(
    crds_installed: ControlPlane, cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """A node deleted mid-run: the gang restarts, node 0 is stopped with its grace and logs the
    checkpoint it writes on SIGTERM. The node removes each container's log the moment it has
    stopped, as a real kubelet does, before anyone can read it after the exit: the operator
    followed the logs while the pods stopped, and the checkpoint reaches status.lastCheckpoint."""
    ns = cluster.namespace
    with ProcessNode(
        crds_installed.api_client, namespaces=[ns], workdir=tmp_path / "node", remove_deleted_logs=True
    ) as node:
        cluster.create_job("sigterm", nodes=2, command=[sys.executable, "-c", STOPPING])
        cluster.wait_job("sigterm", has_condition("Running"), "Running", 60)
        wait_for(lambda: "up" in node.logs(ns, "sigterm-node-1"), 30, "node 1 up")
        cluster.core.delete_namespaced_pod("sigterm-node-1", ns)

        def signal_checkpoint(job: dict[str, Any]) -> bool:
            return ((job.get("status") or {}).get("lastCheckpoint") or {}).get("reason") == "signal"

        done = cluster.wait_job("sigterm", signal_checkpoint, "the SIGTERM checkpoint in lastCheckpoint", 90)
        assert done["status"]["attempt"] == 1 and done["status"]["lastCheckpoint"]["step"] == 7
        # The node stops its pods one after the other: attempt 1 starts once both are released.
        cluster.wait_pods("sigterm", 2, attempt=1, timeout=90)
        kept = (archive(cluster, "sigterm", 0) or {})["data"]
        assert kept["node-0.log"].splitlines()[-1] == "node 0 checkpointed on SIGTERM", kept
        assert kept["node-1.log"].splitlines()[-1] == "node 1 checkpointed on SIGTERM", kept
        cluster.delete_job("sigterm")
        no_pods_left(cluster, "sigterm", 120)
        assert node.errors == []


# As STOPPING, but each node exits the moment SIGTERM comes, as a trainer that has little to save
# does: no read after the stop, and no follow begun once the pod is seen deleted, can keep its log.
QUICK = STOPPING.replace("time.sleep(3)", "pass")


@pytest.mark.parametrize("stop", ["suspend", "gang restart"])
def test_the_log_of_a_pod_the_operator_deletes_is_kept_however_fast_it_stops(
    crds_installed: ControlPlane, cluster: Cluster, operator: OperatorProcess, tmp_path: Path, stop: str
) -> None:
    """The operator deletes the pods itself (the job suspended; node 0 in a gang restart after
    node 1 was deleted): it follows each one's log before it asks for the delete, so its last
    line is kept though the node serves no log of a pod once it is being deleted (only streams
    opened before go on) and removes it the moment the container has stopped."""
    ns = cluster.namespace
    assert "time.sleep(3)" not in QUICK
    with ProcessNode(
        crds_installed.api_client,
        namespaces=[ns],
        workdir=tmp_path / "node",
        remove_deleted_logs=True,
        no_log_once_deleted=True,
    ) as node:
        cluster.create_job("quick", nodes=2, command=[sys.executable, "-c", QUICK])
        cluster.wait_job("quick", has_condition("Running"), "Running", 60)
        for rank in (0, 1):
            wait_for(lambda rank=rank: "up" in node.logs(ns, f"quick-node-{rank}"), 30, f"node {rank} up")
        if stop == "suspend":
            cluster.custom.patch_namespaced_custom_object(
                naming.GROUP, naming.VERSION, ns, naming.PLURAL, "quick", {"spec": {"runPolicy": {"suspend": True}}}
            )
            no_pods_left(cluster, "quick", 60)
            stopped_by_operator = [0, 1]
        else:
            cluster.core.delete_namespaced_pod("quick-node-1", ns)
            cluster.wait_pods("quick", 2, attempt=1, timeout=90)
            stopped_by_operator = [0]
        kept = (archive(cluster, "quick", 0) or {}).get("data") or {}
        for rank in stopped_by_operator:
            assert kept.get(f"node-{rank}.log", "").splitlines()[-1:] == [f"node {rank} checkpointed on SIGTERM"], kept
        done = cluster.wait_job("quick", lambda job: "lastCheckpoint" in job.get("status", {}), "lastCheckpoint", 30)
        assert done["status"]["lastCheckpoint"]["reason"] == "signal", done["status"]
        cluster.delete_job("quick")
        no_pods_left(cluster, "quick", 120)
        assert node.errors == []
