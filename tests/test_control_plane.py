"""What a real kube-apiserver (and kube-controller-manager) accepts, rejects and cleans up.

A mock accepts anything; these run against the control plane of tests/cluster/, so the
CRD's structural schema and CEL rules, the status subresource, the rendered pods' validation
and Pod Security admission and garbage collection are the server's own. (The harness's own
checks against the same server: test_harness_control_plane.py.)
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cases import INVALID_JOBS
from kubernetes import client
from support.controlplane import ControlPlane, free_port
from support.jobs import valid_job
from support.objects import api_error, gone, owner_ref, phase_of, pod
from support.operator_process import running_operator
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


# --- garbage collection ---------------------------------------------------------------------


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


# --- the process node: pods run as local processes, status reported for real ----------------


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

    log = tmp_path / "operator.log"
    workdir = tmp_path / "node"
    with (
        running_operator(crds_installed.kubeconfig, log, namespace) as operator,
        ProcessNode(crds_installed.api_client, namespaces=[namespace], workdir=workdir) as node,
    ):
        crds_installed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
        phase = wait_for(finished, 240, f"the TrainingJob to finish (operator log: {operator.log_path})")
        rank0 = node.logs(namespace, naming.pod_name("e2e", 0))
        assert phase == "Succeeded", f"{rank0[-3000:]}\n{operator.log()[-3000:]}"
        assert '"event":"done"' in rank0, rank0[-3000:]
        checkpoints = node.workdir / "pods" / namespace / naming.pod_name("e2e", 0) / "volumes" / "checkpoints"
        assert list(checkpoints.glob("step-*")), "rank 0 wrote no checkpoint into its mounted volume"
        assert node.errors == []


def test_snapshot_matches_the_live_apiserver(control_plane: ControlPlane) -> None:
    live = json.loads(control_plane.kubectl("get", "--raw", k8s_schemas.SOURCE).stdout)
    regenerated = k8s_schemas.structural(live)
    assert k8s_schemas.snapshot_text(regenerated) == k8s_schemas.SNAPSHOT.read_text(), (
        "the apiserver's core/v1 schemas drifted from api/k8s/: run tests/cluster/vendor_k8s_schemas.py"
    )
