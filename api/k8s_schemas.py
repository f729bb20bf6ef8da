"""Kubernetes' own schemas for the pod parts a TrainingJob's `spec.template` may carry.

The schemas are not written by hand: `structural(openapi)` turns the kube-apiserver's
OpenAPI v3 document (`GET /openapi/v3/api/v1`) into CRD-ready structural schemas, and a
snapshot of its output for the Kubernetes version the tests run (`KUBERNETES_VERSION`,
pinned in tests/cluster/install.sh) is committed under `k8s/`. `python
tests/cluster/vendor_k8s_schemas.py` regenerates it from a real apiserver; a cluster test
fails when the snapshot and the live apiserver disagree.

The same snapshot serves twice: inlined into the CRD (the API server validates on apply)
and compiled with fastjsonschema (pure Python, no dependencies) so that the models reject
exactly what the CRD rejects, naming the field, before anything reaches a cluster.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastjsonschema

KUBERNETES_VERSION = "v1.37.2"
SNAPSHOT = Path(__file__).parent / "k8s" / f"core-v1-{KUBERNETES_VERSION}.json"
SOURCE = "/openapi/v3/api/v1"

POD_SPEC = "io.k8s.api.core.v1.PodSpec"
CONTAINER = "io.k8s.api.core.v1.Container"
# What spec.template may set, by the Kubernetes type that owns the field. Taking the field's
# schema from its owner keeps Kubernetes' list semantics (x-kubernetes-list-type/-map-keys).
VENDORED: dict[str, tuple[str, tuple[str, ...]]] = {
    "podSpec": (
        POD_SPEC,
        (
            "affinity",
            "dnsConfig",
            "hostNetwork",
            "imagePullSecrets",
            "initContainers",
            "runtimeClassName",
            "schedulingGates",
            "securityContext",
            "terminationGracePeriodSeconds",
            "topologySpreadConstraints",
            "volumes",
        ),
    ),
    "container": (CONTAINER, ("envFrom", "securityContext", "volumeMounts", "workingDir")),
}

INT_OR_STRING: dict[str, Any] = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
# apimachinery types whose OpenAPI form a CRD cannot take as is. IntOrString and Quantity
# are written as either in YAML (`port: 8080`, `sizeLimit: 1Gi`, `sizeLimit: 1`); an
# ObjectMeta below the root (an ephemeral volume's claim template) is kept whole, as
# controller-gen does, and validated when the pod is created.
# Kubernetes' quantity syntax (resource.Quantity), as controller-gen writes it into CRDs; the
# pattern applies to the string form only.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
SPECIAL_TYPES: dict[str, dict[str, Any]] = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": INT_OR_STRING,
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {**INT_OR_STRING, "pattern": QUANTITY_PATTERN},
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    },
}
# The JSONSchemaProps fields a CRD accepts. Everything else the apiserver's document carries
# (descriptions, x-kubernetes-patch-*, x-kubernetes-unions) is dropped: descriptions alone
# would push the CRD past what `kubectl apply` can store, and the rest is refused as unknown.
KEPT = frozenset(
    {
        "type",
        "format",
        "properties",
        "items",
        "required",
        "enum",
        "default",
        "additionalProperties",
        "minimum",
        "maximum",
        "maxLength",
        "maxItems",
        "pattern",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
    }
)


ZERO_VALUES: tuple[Any, ...] = ("", 0, {}, [], False)


def _ref_name(node: dict[str, Any]) -> str | None:
    """The type a node refers to: `$ref`, or OpenAPI v3's `allOf: [{$ref}]` wrapper."""
    if "$ref" in node:
        return str(node["$ref"]).rsplit("/", 1)[-1]
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and "$ref" in all_of[0]:
        return str(all_of[0]["$ref"]).rsplit("/", 1)[-1]
    return None


def _structural(node: dict[str, Any], schemas: dict[str, Any], stack: tuple[str, ...]) -> dict[str, Any]:
    name = _ref_name(node)
    if name is not None:
        if name in SPECIAL_TYPES:
            return copy.deepcopy(SPECIAL_TYPES[name])
        if name in stack:
            raise ValueError(f"recursive type {name}: a CRD schema cannot express it")
        # The referring node's own list/map markers and default stay; its description goes.
        referred = _structural(schemas[name], schemas, (*stack, name))
        own = {key: value for key, value in node.items() if key in KEPT}
        return {**referred, **own}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in KEPT:
            continue
        if key == "properties":
            out[key] = {prop: _structural(child, schemas, stack) for prop, child in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, schemas, stack)
        else:
            out[key] = copy.deepcopy(value)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _drop_zero_defaults(node: Any, keep: frozenset[str] = frozenset()) -> None:
    """Go zero values (`""`, `0`, `{}`) are published as defaults; in a CRD they would be
    applied, and a required field defaulted to "" is no longer missing. Only a list-map key
    that is not required keeps its default: a CRD demands one for such keys."""
    if isinstance(node, list):
        for item in node:
            _drop_zero_defaults(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("default", 1) in ZERO_VALUES:
        del node["default"]
    items = node.get("items")
    item_keep = frozenset(node.get("x-kubernetes-list-map-keys", ())) - set((items or {}).get("required", ()))
    for key, value in node.items():
        if key == "properties":
            for name, child in value.items():
                saved = child.get("default") if name in keep else None
                _drop_zero_defaults(child)
                if saved is not None:
                    child["default"] = saved
        elif key == "items":
            _drop_zero_defaults(value, item_keep)
        else:
            _drop_zero_defaults(value)


def structural(
    openapi: dict[str, Any],
    version: str = KUBERNETES_VERSION,
    vendored: dict[str, tuple[str, tuple[str, ...]]] = VENDORED,
) -> dict[str, Any]:
    """The snapshot: the `vendored` fields as structural schemas, `$ref`s resolved, from an
    apiserver's `/openapi/v3/api/v1` document."""
    schemas = openapi["components"]["schemas"]
    snapshot: dict[str, Any] = {"kubernetesVersion": version, "source": SOURCE}
    for group, (owner, fields) in vendored.items():
        properties = schemas[owner]["properties"]
        snapshot[group] = {field: _structural(properties[field], schemas, (owner,)) for field in fields}
    _drop_zero_defaults(snapshot)
    return snapshot


def snapshot_text(snapshot: dict[str, Any]) -> str:
    return json.dumps(snapshot, indent=1, sort_keys=True) + "\n"


@functools.cache
def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SNAPSHOT.read_text())
    return data


# Bounds Kubernetes enforces in code rather than in its OpenAPI, added where kubetrain's CEL
# rules read the value: without them the API server prices a string at the whole request
# size and refuses the CRD (rule cost over budget). The models check the same bounds.
LIMITS: dict[tuple[str, str, str], dict[str, int]] = {
    # Volume and container names are DNS-1123 labels.
    ("podSpec", "volumes", "[].name"): {"maxLength": 63},
    ("podSpec", "initContainers", "[].name"): {"maxLength": 63},
    ("container", "volumeMounts", "[].name"): {"maxLength": 63},
    # A mount path is a Linux path: PATH_MAX.
    ("container", "volumeMounts", "[].mountPath"): {"maxLength": 4096},
    # Unbounded in Kubernetes; a sidecar exposing more than 64 ports is not a sidecar.
    ("podSpec", "initContainers", "[].ports"): {"maxItems": 64},
}


def _descend(node: dict[str, Any], parts: list[str | None]) -> dict[str, Any]:
    """The schema node at a path of property names, None standing for a list item."""
    for part in parts:
        child: dict[str, Any] = node["items"] if part is None else node["properties"][part]
        node = child
    return node


def _node(root: dict[str, Any], path: str) -> dict[str, Any]:
    parts = path.replace("[]", ".[]").strip(".").split(".")
    return _descend(root, [None if part == "[]" else part for part in parts])


def schema(group: str, field: str) -> dict[str, Any]:
    """One vendored field's schema with `LIMITS` applied, e.g. `schema("podSpec", "volumes")`."""
    out: dict[str, Any] = copy.deepcopy(load()[group][field])
    for (limit_group, limit_field, path), bounds in LIMITS.items():
        if (limit_group, limit_field) == (group, field):
            _node(out, path).update(bounds)
    return out


def closed(node: Any) -> Any:
    """The schema with unknown fields rejected, as the API server does on a strict apply: a
    structural schema says nothing about fields it does not list, JSON Schema accepts them."""
    if isinstance(node, list):
        return [closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: closed(value) if key not in ("enum", "default") else value for key, value in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


# OpenAPI formats the snapshot uses. fastjsonschema checks formats on strings only, and the
# numeric ones apply to numbers: nothing to check beyond the type here.
_FORMATS: dict[str, Callable[[str], bool]] = {name: lambda _: True for name in ("int32", "int64", "double", "byte")}


@functools.cache
def _validator(group: str, field: str) -> Callable[[Any], Any]:
    compiled: Callable[[Any], Any] = fastjsonschema.compile(closed(schema(group, field)), formats=_FORMATS)
    return compiled


def _path(parts: list[Any]) -> str:
    """fastjsonschema's `["data", "nodeAffinity", 0]` -> `nodeAffinity[0]`, relative to the field."""
    out = ""
    for part in parts[1:]:
        out += f"[{part}]" if isinstance(part, int) or str(part).isdigit() else f".{part}"
    return out.removeprefix(".")


def _at(node: dict[str, Any], path: list[Any]) -> dict[str, Any]:
    for part in path[1:]:
        child: dict[str, Any] = (
            node["items"] if isinstance(part, int) or str(part).isdigit() else node["properties"][part]
        )
        node = child
    return node


def check(group: str, field: str, value: Any) -> None:
    """Raise ValueError("<path>: <reason>") when `value` breaks Kubernetes' schema of the
    field; the path is relative to the field, as the models' error messages expect."""
    try:
        _validator(group, field)(value)
    except fastjsonschema.JsonSchemaValueException as error:
        path = list(error.path or ["data"])
        reason = error.message.removeprefix(str(error.name)).strip()
        if error.rule == "additionalProperties":
            allowed = set(_at(schema(group, field), path).get("properties", {}))
            unknown = sorted(set(error.value) - allowed)
            path.append(unknown[0])
            reason = "unknown field (not part of the Kubernetes API)"
        elif error.rule == "required":
            missing = sorted(set(_at(schema(group, field), path)["required"]) - set(error.value))
            path.append(missing[0])
            reason = "required value"
        where = _path(path)
        raise ValueError(f"{where}: {reason}" if where else reason) from None
