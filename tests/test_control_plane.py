"""What a real kube-apiserver (and kube-controller-manager) accepts, rejects and cleans up.

A mock accepts anything; these run against the control plane of tests/cluster/, so the
CRD's structural schema and CEL rules, pod validation, Pod Security admission, RBAC, the
status subresource and garbage collection are the server's own.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from cases import INVALID_JOBS
from kubernetes import client
from support import tools
from support.controlplane import ControlPlane, find_tool, free_port
from support.jobs import valid_job
from support.kubelet import FakeKubelet
from support.operator_process import OperatorProcess
from support.processnode import ProcessNode
from support.waiting import wait_for

from kubetrain.api import k8s_schemas, naming

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
GROUP, VERSION, PLURAL = naming.GROUP, naming.VERSION, naming.PLURAL


def create_job(api: Any, namespace: str, doc: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    # Strict, as kubectl apply is: an unknown field is an error, not silently pruned.
    result: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, doc, field_validation="Strict", **kwargs
    )
    return result


def contains(got: Any, sent: Any) -> bool:
    """`got` holds everything in `sent` (and maybe more, such as defaults)."""
    if isinstance(sent, dict):
        return isinstance(got, dict) and all(k in got and contains(got[k], v) for k, v in sent.items())
    return bool(got == sent)


def api_error(exc: client.ApiException) -> tuple[str, list[str]]:
    """The Status message and the fields its causes name."""
    body = json.loads(exc.body or "{}")
    causes = body.get("details", {}).get("causes", [])
    return body.get("message", ""), [c.get("field", "") for c in causes]


def pod(name: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"], **container}],
        },
    }


# --- the CRD -------------------------------------------------------------------------------


def test_crd_is_established_with_status_subresource(crds_installed: ControlPlane, kube_api: Any) -> None:
    crd = client.ApiextensionsV1Api(kube_api).read_custom_resource_definition(naming.CRD_NAME)
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    # A non-structural schema is accepted but flagged; ours must be clean.
    assert "NonStructuralSchema" not in conditions
    (served,) = [v for v in crd.spec.versions if v.name == VERSION]
    assert served.subresources.status is not None


def test_valid_job_is_accepted_by_kubectl_apply(crds_installed: ControlPlane, namespace: str) -> None:
    # kubectl apply downloads the server's OpenAPI first: this is what breaks when the
    # apiserver is built with the wrong Go version.
    doc = valid_job("valid")
    crds_installed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
    got = json.loads(crds_installed.kubectl("get", "trainingjob", "valid", "-n", namespace, "-o", "json").stdout)
    assert got["spec"]["nodes"] == doc["spec"]["nodes"]
    printed = crds_installed.kubectl("get", "tj", "-n", namespace).stdout
    assert "valid" in printed and "NODES" in printed


def test_valid_job_is_accepted_and_defaulted(crds_installed: ControlPlane, kube_api: Any, namespace: str) -> None:
    doc = valid_job("defaults")
    created = create_job(kube_api, namespace, doc)
    assert created["metadata"]["generation"] == 1
    # The server fills the schema's defaults: everything we sent is kept, and more is set.
    assert contains(created["spec"], doc["spec"])
    assert created["spec"] != doc["spec"]


@pytest.mark.parametrize(("case", "doc", "field"), INVALID_JOBS, ids=[c[0] for c in INVALID_JOBS])
def test_invalid_job_is_rejected_naming_the_field(
    crds_installed: ControlPlane, kube_api: Any, namespace: str, case: str, doc: dict[str, Any], field: str
) -> None:
    doc = copy.deepcopy(doc)
    doc.setdefault("metadata", {}).pop("namespace", None)
    try:
        create_job(kube_api, namespace, doc, dry_run="All")
    except client.ApiException as exc:
        message, fields = api_error(exc)
        assert exc.status in (400, 422), message
        assert field in message or any(f.startswith(field) for f in fields), (
            f"{case}: the server rejected it, but without naming {field}: {message}"
        )
    else:
        pytest.fail(f"{case}: the API server accepted a TrainingJob the models reject ({field})")


def test_status_changes_only_through_the_status_subresource(
    crds_installed: ControlPlane, kube_api: Any, namespace: str
) -> None:
    api = client.CustomObjectsApi(kube_api)
    doc = valid_job("status")
    doc["status"] = {"phase": "Succeeded"}
    created = create_job(kube_api, namespace, doc)
    assert created.get("status", {}).get("phase") is None, "status was written on create"

    patched = api.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "status", {"status": {"phase": "Failed"}}
    )
    assert patched.get("status", {}).get("phase") is None, "status was written through the main resource"

    nodes = created["spec"]["nodes"]
    via_status = api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "status", {"status": {"phase": "Running"}, "spec": {"nodes": nodes + 1}}
    )
    assert via_status["status"]["phase"] == "Running"
    assert via_status["spec"]["nodes"] == nodes, "spec was written through the status subresource"
    assert via_status["metadata"]["generation"] == created["metadata"]["generation"]

    with pytest.raises(client.ApiException) as err:
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "status", {"status": {"phase": "Exploded"}}
        )
    assert "status.phase" in api_error(err.value)[0]


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


# --- garbage collection ---------------------------------------------------------------------


def owner_ref(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def gone(read: Any) -> bool:
    try:
        read()
    except client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


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


def test_deleting_a_trainingjob_collects_its_pods_and_service(
    crds_installed: ControlPlane, kube_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    job = create_job(kube_api, namespace, valid_job("owner"))
    ref = owner_ref(job["apiVersion"], job["kind"], "owner", job["metadata"]["uid"])
    dependent = pod("owner-node-0")
    dependent["metadata"]["ownerReferences"] = [ref]
    core.create_namespaced_pod(namespace, dependent)
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "owner", "ownerReferences": [ref]},
            "spec": {"clusterIP": "None", "selector": {"a": "b"}},
        },
    )
    client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "owner")
    # The collector learns a new CRD type on its ~30 s discovery refresh, so the first
    # TrainingJob GC of a session can take that long; after that it is sub-second.
    wait_for(lambda: gone(lambda: core.read_namespaced_pod("owner-node-0", namespace)), 90, "the job's pod GC")
    wait_for(lambda: gone(lambda: core.read_namespaced_service("owner", namespace)), 30, "the job's Service GC")


# --- the kubelet helper against the real server's status rules ---------------------------


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


# --- tools ---------------------------------------------------------------------------------


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


# --- the process node: pods run as local processes, status reported for real ----------------


def phase_of(core: Any, namespace: str, name: str) -> Callable[[], str | None]:
    def check() -> str | None:
        phase = core.read_namespaced_pod(name, namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    return check


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
        assert ok.spec.node_name == node.node_name and ok.status.pod_ip == "127.0.0.1"
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


DDP_SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
assert t.item() == dist.get_world_size() * (dist.get_world_size() + 1) / 2, t
print("world", dist.get_world_size(), "sum", t.item(), flush=True)
dist.destroy_process_group()
"""


def test_rendered_gang_is_admitted_as_restricted_and_runs_ddp(
    control_plane: ControlPlane, crds_installed: ControlPlane, kube_api: Any, namespace: str, tmp_path: Path
) -> None:
    """The operator's rendered Service and pods pass the real server's validation and the
    `restricted` Pod Security level, and their env contract rendezvouses a 2-rank gloo DDP
    job when the process node runs them."""
    from kubetrain.api.models import TrainingJob
    from kubetrain.operator.render import render_pods, render_service

    core = client.CoreV1Api(kube_api)
    core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    port = free_port()
    created = create_job(
        kube_api, namespace, valid_job("ddp", command=[sys.executable, "-c", DDP_SCRIPT], masterPort=port)
    )
    job = TrainingJob.model_validate(created)
    uid = created["metadata"]["uid"]
    core.create_namespaced_service(namespace, render_service(job, namespace, uid))
    pods = render_pods(job, namespace, uid, attempt=0)
    for doc in pods:
        core.create_namespaced_pod(namespace, doc)

    with ProcessNode(control_plane.api_client, namespaces=[namespace], workdir=tmp_path) as node:
        for doc in pods:
            name = doc["metadata"]["name"]
            phase = wait_for(phase_of(core, namespace, name), 120, f"{name} to finish")
            assert phase == "Succeeded", node.logs(namespace, name)
            assert "world 2 sum 3.0" in node.logs(namespace, name)
        assert node.errors == []


def test_end_to_end_apply_operator_pods_training_succeeded(
    crds_installed: ControlPlane, kube_api: Any, namespace: str, tmp_path: Path
) -> None:
    """kubectl apply -> the operator creates the gang -> the process node runs the real
    trainer under torchrun (gloo, 2 nodes) -> the TrainingJob reports Succeeded."""
    master_port = free_port()
    doc = valid_job("e2e", masterPort=master_port)
    doc["spec"]["training"] = {**doc["spec"]["training"], "epochs": 1}
    custom = client.CustomObjectsApi(kube_api)

    def finished() -> str | None:
        job = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "e2e")
        phase = job.get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    operator = OperatorProcess(crds_installed.kubeconfig, tmp_path / "operator.log", namespaces=namespace).start()
    try:
        with ProcessNode(crds_installed.api_client, namespaces=[namespace], workdir=tmp_path / "node") as node:
            crds_installed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
            phase = wait_for(finished, 240, f"the TrainingJob to finish (operator log: {operator.log_path})")
            rank0 = node.logs(namespace, naming.pod_name("e2e", 0))
            assert phase == "Succeeded", f"{rank0[-3000:]}\n{operator.log()[-3000:]}"
            assert '"event":"done"' in rank0, rank0[-3000:]
            checkpoints = node.workdir / "pods" / namespace / naming.pod_name("e2e", 0) / "volumes" / "checkpoints"
            assert list(checkpoints.glob("step-*")), "rank 0 wrote no checkpoint into its mounted volume"
            assert node.errors == []
    finally:
        operator.stop()
    assert "Traceback" not in operator.log(), operator.log()[-3000:]


def test_snapshot_matches_the_live_apiserver(control_plane: ControlPlane) -> None:
    live = json.loads(control_plane.kubectl("get", "--raw", k8s_schemas.SOURCE).stdout)
    regenerated = k8s_schemas.structural(live)
    assert k8s_schemas.snapshot_text(regenerated) == k8s_schemas.SNAPSHOT.read_text(), (
        "the apiserver's core/v1 schemas drifted from api/k8s/: run tests/cluster/vendor_k8s_schemas.py"
    )


def test_a_control_plane_that_broke_fails_its_block() -> None:
    """support.controlplane.running(), which every control-plane fixture uses, fails when a
    component exited on its own during the block."""
    with pytest.raises(AssertionError, match="kube-controller-manager exited with -9"), tools.control_plane() as cp:
        cp.processes["kube-controller-manager"].kill()
        cp.processes["kube-controller-manager"].wait()
