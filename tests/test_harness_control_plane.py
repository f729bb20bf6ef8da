"""The test harness against the real control plane it runs (tests/support/): the server
validates pods and enforces Pod Security and RBAC, its garbage collector runs, helm installs,
the fake kubelet moves pods as a kubelet would, the process node runs them as local processes,
and a control plane that broke fails its block. The product's tests against the same server
are in test_control_plane.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from kubernetes import client
from support import tools
from support.controlplane import ControlPlane, find_tool
from support.kubelet import FakeKubelet
from support.objects import api_error, gone, owner_ref, phase_of, pod
from support.processnode import ProcessNode
from support.waiting import wait_for

pytestmark = pytest.mark.cluster


# --- pods: validation, Pod Security admission, RBAC ------------------------------------------


@pytest.mark.parametrize(
    ("case", "container", "field"),
    [
        ("port-name-over-15", {"ports": [{"name": "rendezvous-port-x", "containerPort": 29500}]}, "ports[0].name"),
        ("env-name-with-equals", {"env": [{"name": "A=B", "value": "x"}]}, "env[0].name"),
        ("negative-cpu", {"resources": {"requests": {"cpu": "-1"}}}, "resources.requests[cpu]"),
    ],
)
def test_invalid_pod_is_rejected(
    kube_api: Any, namespace: str, case: str, container: dict[str, Any], field: str
) -> None:
    with pytest.raises(client.ApiException) as err:
        client.CoreV1Api(kube_api).create_namespaced_pod(namespace, pod(case, **container))
    message, _ = api_error(err.value)
    assert err.value.status == 422
    assert f"spec.containers[0].{field}" in message


def test_restricted_namespace_rejects_a_privileged_pod(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    privileged = pod("privileged", securityContext={"privileged": True})
    # The same pod passes where no Pod Security level is enforced: the refusal below is
    # admission's, not validation's.
    core.create_namespaced_pod(namespace, privileged, dry_run="All")

    core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})

    def refused_on_dry_run() -> bool:
        try:
            core.create_namespaced_pod(namespace, privileged, dry_run="All")
        except client.ApiException as exc:
            return exc.status == 403
        return False

    # Admission reads namespace labels from an informer: wait until it has seen the patch
    # (the real create raced it once under load and was admitted).
    wait_for(refused_on_dry_run, 10, "Pod Security admission enforcing restricted")
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_pod(namespace, privileged)
    message, _ = api_error(err.value)
    assert err.value.status == 403
    assert 'violates PodSecurity "restricted:latest"' in message and "privileged" in message

    compliant = pod(
        "compliant",
        securityContext={
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    )
    core.create_namespaced_pod(namespace, compliant)


def test_rbac_is_enforced(control_plane: ControlPlane, namespace: str) -> None:
    sa = f"system:serviceaccount:{namespace}:default"

    def can_list_pods() -> str:
        proc = control_plane.kubectl("auth", "can-i", "list", "pods", "-n", namespace, "--as", sa, check=False)
        return proc.stdout.strip()

    assert can_list_pods() == "no"
    control_plane.kubectl(
        "create", "rolebinding", "view", "-n", namespace, "--clusterrole=view", f"--serviceaccount={namespace}:default"
    )
    wait_for(lambda: can_list_pods() == "yes", 10, "the RoleBinding to take effect")


def test_deleting_a_configmap_collects_its_dependents(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = owner_ref("v1", "ConfigMap", "owner", owner.metadata.uid)
    dependent = pod("dependent")
    dependent["metadata"]["ownerReferences"] = [ref]
    core.create_namespaced_pod(namespace, dependent)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "dependent", "ownerReferences": [ref]}})

    core.delete_namespaced_config_map("owner", namespace)
    wait_for(lambda: gone(lambda: core.read_namespaced_pod("dependent", namespace)), 30, "the dependent pod's GC")
    wait_for(lambda: gone(lambda: core.read_namespaced_config_map("dependent", namespace)), 30, "the dependent's GC")


def test_fake_kubelet_moves_pods_through_their_phases(kube_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    kubelet = FakeKubelet(kube_api)
    for name in ("ok", "oom"):
        core.create_namespaced_pod(namespace, pod(name))
    assert core.read_namespaced_pod("ok", namespace).status.phase == "Pending"

    running = kubelet.run(namespace, "ok")
    assert running.status.phase == "Running"
    assert running.spec.node_name == kubelet.node_name
    assert running.status.container_statuses[0].state.running is not None

    done = kubelet.succeed(namespace, "ok")
    assert done.status.phase == "Succeeded"
    assert done.status.container_statuses[0].state.terminated.exit_code == 0

    kubelet.run(namespace, "oom")
    failed = kubelet.fail(namespace, "oom", exit_code=137, reason="OOMKilled")
    assert failed.status.phase == "Failed"
    terminated = failed.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")

    # The server, not the helper, keeps terminal phases terminal.
    with pytest.raises(client.ApiException) as err:
        kubelet.run(namespace, "oom")
    assert err.value.status == 422

    # A running pod on a node is deleted gracefully: it stays until its kubelet confirms.
    core.create_namespaced_pod(namespace, pod("busy"))
    kubelet.run(namespace, "busy")
    core.delete_namespaced_pod("busy", namespace)
    assert core.read_namespaced_pod("busy", namespace).metadata.deletion_timestamp is not None
    kubelet.confirm_deletion(namespace, "busy")
    assert gone(lambda: core.read_namespaced_pod("busy", namespace))


def test_helm_installs_a_chart(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    if find_tool("helm") is None:
        pytest.skip("helm not built: run `bash tests/cluster/install.sh`")
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\nkubeVersion: '>=1.30.0-0'\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata:\n  k: v\n"
    )
    try:
        control_plane.helm("install", "probe", str(chart), "-n", namespace, "--wait", "--timeout=60s")
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"helm install failed: {exc.stderr}")
    data = json.loads(control_plane.kubectl("get", "configmap", "probe", "-n", namespace, "-o", "json").stdout)
    assert data["data"] == {"k": "v"}


def test_process_node_runs_pods_and_reports_their_exit(
    control_plane: ControlPlane, kube_api: Any, namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "settings"}, "data": {"GREETING": "hello"}})
    script = (
        "import os, pathlib, sys\n"
        "assert os.environ['MASTER_ADDR'] == '127.0.0.1', os.environ['MASTER_ADDR']\n"
        "pathlib.Path(os.environ['OUT'], 'done').write_text(os.environ['POD'] + ' ' + os.environ['GREETING'])\n"
        "print('rank', os.environ['RANK'], flush=True)\n"
        "sys.exit(int(os.environ['RANK']) * 3)\n"
    )
    for rank in (0, 1):
        doc = pod(
            f"worker-{rank}",
            command=[sys.executable, "-c", script],
            env=[
                {"name": "RANK", "value": str(rank)},
                {"name": "MASTER_ADDR", "value": f"worker-0.workers.{namespace}.svc.cluster.local"},
                {"name": "OUT", "value": "/data"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "GREETING"}}},
            ],
            volumeMounts=[{"name": "data", "mountPath": "/data"}],
            terminationMessagePolicy="FallbackToLogsOnError",
        )
        doc["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
        core.create_namespaced_pod(namespace, doc)
    # As torchrun does, the sleeper starts its worker in a session of its own.
    worker = (
        f"import subprocess, time; subprocess.Popen([{sys.executable!r}, '-c', 'import time; time.sleep(300)'], "
        "start_new_session=True); time.sleep(300)"
    )
    sleeper = pod("sleeper", command=[sys.executable, "-c", worker])
    sleeper["spec"]["terminationGracePeriodSeconds"] = 5
    core.create_namespaced_pod(namespace, sleeper)

    with ProcessNode(control_plane.api_client, namespaces=[namespace], workdir=tmp_path) as node:
        assert wait_for(phase_of(core, namespace, "worker-0"), 30, "worker-0 to finish") == "Succeeded"
        assert wait_for(phase_of(core, namespace, "worker-1"), 30, "worker-1 to finish") == "Failed"
        ok, bad = (core.read_namespaced_pod(f"worker-{r}", namespace) for r in (0, 1))
        # Each pod an address of its own in 127.0.0.0/8 (its agent listens there, as on a cluster).
        assert ok.spec.node_name == node.node_name and ok.status.pod_ip.startswith("127.")
        assert ok.status.pod_ip != bad.status.pod_ip
        assert ok.status.container_statuses[0].state.terminated.exit_code == 0
        terminated = bad.status.container_statuses[0].state.terminated
        assert (terminated.exit_code, terminated.reason) == (3, "Error")
        assert "rank 1" in terminated.message  # FallbackToLogsOnError
        data = tmp_path / "pods" / namespace / "worker-0" / "volumes" / "data" / "done"
        assert data.read_text() == "worker-0 hello"

        wait_for(lambda: core.read_namespaced_pod("sleeper", namespace).status.phase == "Running", 30, "sleeper")
        (tree,) = node.pods[core.read_namespaced_pod("sleeper", namespace).metadata.uid].procs.values()
        (child,) = wait_for(lambda: psutil.Process(tree.pid).children(), 30, "the sleeper's worker")
        core.delete_namespaced_pod("sleeper", namespace)
        wait_for(lambda: gone(lambda: core.read_namespaced_pod("sleeper", namespace)), 30, "the sleeper's deletion")
        assert not tree.running(), "deleting the pod left its process running"
        _, alive = psutil.wait_procs([child], timeout=10)
        for survivor in alive:
            survivor.kill()
        assert not alive, "deleting the pod left the worker (a session of its own) running"
        assert node.errors == []


def test_a_control_plane_that_broke_fails_its_block() -> None:
    """support.controlplane.running(), which every control-plane fixture uses, fails when a
    component exited on its own during the block."""
    with pytest.raises(AssertionError, match="kube-controller-manager exited with -9"), tools.control_plane() as cp:
        cp.processes["kube-controller-manager"].kill()
        cp.processes["kube-controller-manager"].wait()
