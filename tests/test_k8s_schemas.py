"""The vendored Kubernetes schemas: generated right and pinned to the tested version (that they
are still what the live apiserver publishes: test_control_plane.py)."""

from __future__ import annotations

from typing import Any

import pytest
from support.controlplane import pinned

from kubetrain.api import k8s_schemas

pytestmark = pytest.mark.unit

REF = "#/components/schemas/"


def openapi(**schemas: Any) -> dict[str, Any]:
    return {"components": {"schemas": schemas}}


def test_snapshot_is_the_pinned_kubernetes_version() -> None:
    assert pinned("K8S_VERSION") == k8s_schemas.KUBERNETES_VERSION, (
        "install.sh pins another Kubernetes: run tests/cluster/vendor_k8s_schemas.py and update KUBERNETES_VERSION"
    )
    snapshot = k8s_schemas.load()
    assert snapshot["kubernetesVersion"] == k8s_schemas.KUBERNETES_VERSION
    for group, (_, fields) in k8s_schemas.VENDORED.items():
        assert sorted(snapshot[group]) == sorted(fields)


def test_refs_are_resolved_into_a_structural_schema() -> None:
    doc = openapi(
        Owner={
            "properties": {
                "items": {
                    "type": "array",
                    "description": "dropped",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "x-kubernetes-patch-merge-key": "name",
                    "items": {"allOf": [{"$ref": REF + "Item"}], "default": {}},
                },
            }
        },
        Item={
            "type": "object",
            "required": ["port"],
            "properties": {
                "name": {"type": "string", "default": ""},
                "port": {"$ref": REF + "io.k8s.apimachinery.pkg.util.intstr.IntOrString"},
                "meta": {"$ref": REF + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
                "protocol": {"type": "string", "default": "TCP", "enum": ["TCP", "UDP"]},
                "count": {"type": "integer", "format": "int32", "default": 0},
            },
        },
    )
    snapshot = k8s_schemas.structural(doc, "v9.9.9", {"owner": ("Owner", ("items",))})
    assert snapshot == {
        "kubernetesVersion": "v9.9.9",
        "source": k8s_schemas.SOURCE,
        "owner": {
            "items": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {
                    "type": "object",
                    "required": ["port"],
                    "properties": {
                        # A list-map key that is not required keeps its default (the CRD demands one).
                        "name": {"type": "string", "default": ""},
                        "port": k8s_schemas.INT_OR_STRING,
                        "meta": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        "protocol": {"type": "string", "default": "TCP", "enum": ["TCP", "UDP"]},
                        # Go zero values are not defaults worth applying.
                        "count": {"type": "integer", "format": "int32"},
                    },
                },
            }
        },
    }


def test_a_recursive_type_is_refused() -> None:
    doc = openapi(
        Owner={"properties": {"tree": {"$ref": REF + "Node"}}},
        Node={"type": "object", "properties": {"child": {"$ref": REF + "Node"}}},
    )
    with pytest.raises(ValueError, match="recursive type Node"):
        k8s_schemas.structural(doc, vendored={"owner": ("Owner", ("tree",))})


@pytest.mark.parametrize(
    ("group", "field", "value", "message"),
    [
        ("podSpec", "volumes", [{"name": "d", "emptyDir": {}, "nfs": {"server": "s"}}], "[0].nfs.path: required value"),
        (
            "podSpec",
            "volumes",
            [{"name": "d", "hostPath": {"path": "/x", "tpye": "Directory"}}],
            "[0].hostPath.tpye: unknown",
        ),
        ("podSpec", "volumes", [{"name": "x" * 64, "emptyDir": {}}], "[0].name: must be shorter than or equal to 63"),
        ("podSpec", "hostNetwork", "true", "must be boolean"),
        ("podSpec", "imagePullSecrets", [{"name": 3}], "[0].name: must be string"),
        ("container", "volumeMounts", [{"name": "d"}], "[0].mountPath: required value"),
        ("podSpec", "schedulingGates", [{}], "[0].name: required value"),
    ],
)
def test_check_names_the_path_inside_the_field(group: str, field: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError) as error:
        k8s_schemas.check(group, field, value)
    assert str(error.value).startswith(message), str(error.value)


@pytest.mark.parametrize(
    ("group", "field", "value"),
    [
        ("podSpec", "volumes", [{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]),
        (
            "podSpec",
            "volumes",
            [{"name": "d", "emptyDir": {"sizeLimit": 1}}, {"name": "e", "emptyDir": {"sizeLimit": "1Gi"}}],
        ),
        ("podSpec", "initContainers", [{"name": "s", "image": "i", "ports": [{"containerPort": 80, "name": "http"}]}]),
        ("podSpec", "securityContext", {"runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}),
    ],
)
def test_check_accepts_what_kubernetes_accepts(group: str, field: str, value: Any) -> None:
    k8s_schemas.check(group, field, value)
