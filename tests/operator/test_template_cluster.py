"""spec.template against the real control plane: what `kubectl apply` refuses, what the pods
the apiserver stores carry, and what each Pod Security level decides for a root image."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from support.controlplane import ControlPlane
from support.jobs import bare_job
from support.objects import Cluster, condition, has_condition
from support.operator_process import OperatorProcess

from kubetrain.api.models import TrainingJob
from kubetrain.operator.render import render_pod
from kubetrain.operator.settings import RenderSettings

pytestmark = pytest.mark.cluster

DATA_JOB_TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "vision"}, "annotations": {"sidecar.istio.io/inject": "false"}},
    "spec": {
        "containers": [
            {
                "name": "trainer",
                "workingDir": "/data",
                "volumeMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "labels", "mountPath": "/etc/labels", "readOnly": True},
                ],
            }
        ],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}},
            {"name": "labels", "configMap": {"name": "labels"}},
        ],
        "initContainers": [{"name": "log-shipper", "image": "fluent-bit:3", "restartPolicy": "Always"}],
        "imagePullSecrets": [{"name": "regcred"}],
    },
}


def contains(got: Any, sent: Any) -> bool:
    """`got` holds everything in `sent`, lists item by item (the apiserver adds defaults)."""
    if isinstance(sent, dict):
        return isinstance(got, dict) and all(k in got and contains(got[k], v) for k, v in sent.items())
    if isinstance(sent, list):
        return isinstance(got, list) and len(got) == len(sent) and all(map(contains, got, sent))
    return bool(got == sent)


def wire(pod: Any) -> dict[str, Any]:
    """A client model as the camelCase document the apiserver stores."""
    document: dict[str, Any] = client.ApiClient().sanitize_for_serialization(pod)
    return document


def test_stored_pods_carry_the_template(cluster: Cluster, operator: OperatorProcess) -> None:
    created = cluster.create_job("data", nodes=2, image="me/private:1", template=DATA_JOB_TEMPLATE)
    pods = cluster.wait_pods("data", 2)
    model = TrainingJob.model_validate(created)
    for rank, pod in enumerate(pods):
        got = wire(pod)
        want = render_pod(model, cluster.namespace, created["metadata"]["uid"], rank, 0, RenderSettings())
        assert contains(got["spec"], want["spec"]), f"the stored pod lost part of\n{yaml.safe_dump(want['spec'])}"
        spec, trainer = got["spec"], got["spec"]["containers"][0]
        # kubetrain-pod: the attempt label for the in-place restart (runPolicy.restartStrategy InPlace);
        # kubetrain-runtime: kubetrain's runtime for an image without it (spec.runtime.inject).
        assert [v["name"] for v in spec["volumes"]] == [
            "checkpoints",
            "dshm",
            "kubetrain-pod",
            "kubetrain-runtime",
            "data",
            "labels",
        ]
        assert spec["volumes"][4]["persistentVolumeClaim"] == {"claimName": "imagenet"}
        assert spec["volumes"][5]["configMap"]["name"] == "labels"
        assert [(m["name"], m["mountPath"]) for m in trainer["volumeMounts"]] == [
            ("checkpoints", "/checkpoints"),
            ("dshm", "/dev/shm"),
            ("kubetrain-pod", "/etc/kubetrain-pod"),
            ("kubetrain-runtime", "/kubetrain-runtime"),
            ("data", "/data"),
            ("labels", "/etc/labels"),
        ]
        assert trainer["workingDir"] == "/data" and trainer["image"] == "me/private:1"
        assert [(c["name"], c.get("restartPolicy")) for c in spec["initContainers"]] == [
            ("kubetrain-runtime", None),
            ("log-shipper", "Always"),
        ]
        assert [c["name"] for c in spec["containers"]] == ["trainer"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert got["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        assert got["metadata"]["labels"]["team"] == "vision"


def test_kubectl_apply_names_the_bad_affinity_field(crds_installed: ControlPlane, namespace: str) -> None:
    template = {
        "spec": {
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"a": "b"}}}}
                    ]
                }
            }
        }
    }
    job = bare_job("spread", metadata={"namespace": namespace}, nodes=2, template=template)
    ok = crds_installed.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(job), check=False)
    assert ok.returncode != 0
    field = "spec.template.spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
    assert f"{field}.podAffinityTerm.topologyKey: Required value" in ok.stderr, ok.stderr
    fixed = copy.deepcopy(job)
    term = fixed["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] = "zone"
    crds_installed.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(fixed))


ROOT_IMAGE = {"image": "pytorch/pytorch:2.5.1", "template": {"spec": {"securityContext": {"runAsUser": 0}}}}


def test_a_root_image_runs_where_baseline_is_enforced(cluster: Cluster, operator: OperatorProcess) -> None:
    cluster.enforce_pod_security("baseline")
    cluster.create_job("root", nodes=2, **ROOT_IMAGE)
    cluster.wait_job("root", has_condition("Created"), "Created under enforce=baseline")
    pods = cluster.wait_pods("root", 2)
    assert [p.spec.security_context.run_as_user for p in pods] == [0, 0]
    assert not any(p.spec.security_context.run_as_non_root for p in pods)


def test_a_root_image_is_refused_where_restricted_is_enforced(cluster: Cluster, operator: OperatorProcess) -> None:
    cluster.enforce_pod_security("restricted")
    cluster.create_job("root", nodes=2, **ROOT_IMAGE)
    job = cluster.wait_job("root", has_condition("Failed", reason="PodCreationFailed"), "PodCreationFailed")
    message = condition(job, "Failed")["message"]  # type: ignore[index]
    # The API's own words: which level, and which fields.
    assert 'violates PodSecurity "restricted:latest"' in message and "runAsUser=0" in message, message
    assert not cluster.pods("root")


SCHEDULING_TEMPLATE = {
    "spec": {
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"kubetrain.dev/job-name": "j"}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "schedulingGates": [{"name": "example.com/quota"}],
        "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
        "terminationGracePeriodSeconds": 120,
    }
}


@pytest.mark.parametrize(
    "template",
    [
        DATA_JOB_TEMPLATE,
        SCHEDULING_TEMPLATE,
        {"spec": {"hostNetwork": True}},
        {"spec": {"securityContext": {"runAsNonRoot": False}}},
        {"spec": {"containers": [{"name": "trainer", "envFrom": [{"prefix": "HP_", "configMapRef": {"name": "hp"}}]}]}},
    ],
    ids=["data", "scheduling", "host-network", "image-user", "env-from"],
)
def test_rendered_pods_are_pods_the_apiserver_accepts(
    crds_installed: ControlPlane, kube_api: Any, namespace: str, template: dict[str, Any]
) -> None:
    """What the renderer merges is a valid Pod, and the apiserver keeps all of it."""
    model = TrainingJob.model_validate(bare_job(template=template))
    pod = render_pod(model, namespace, "0b6c3c2e-0000-0000-0000-000000000000", 0, 0)
    pod["metadata"].pop("ownerReferences")  # the owner does not exist; nothing here is about it
    created = client.CoreV1Api(kube_api).create_namespaced_pod(namespace, pod, dry_run="All")
    assert contains(wire(created)["spec"], pod["spec"])


def test_the_bring_your_data_example_applies(crds_installed: ControlPlane, namespace: str) -> None:
    example = Path(__file__).resolve().parent.parent.parent / "examples" / "byo-data.yaml"
    crds_installed.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(example))
