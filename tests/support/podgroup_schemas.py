"""Kubernetes' PodGroup spec schemas, vendored per version (tests/cluster/vendor_podgroup_schemas.py
writes them), and a validator that rejects what the API server would, unknown fields included."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastjsonschema

from kubetrain.api import k8s_schemas

HERE = Path(__file__).resolve().parent.parent / "operator" / "schemas"
# (apiVersion, the Kubernetes release that serves it) -> its snapshot.
SCHEMAS = {
    ("scheduling.k8s.io/v1alpha2", "v1.36.3"): HERE / "podgroup-v1alpha2-v1.36.3.json",
    ("scheduling.k8s.io/v1beta1", "v1.37.2"): HERE / "podgroup-v1beta1-v1.37.2.json",
}


def source(api_version: str) -> str:
    """Where an apiserver serves the version's OpenAPI v3 document."""
    return f"/openapi/v3/apis/{api_version}"


def snapshot(document: dict[str, Any], version: str, api_version: str) -> dict[str, Any]:
    """A version's PodGroup spec as a structural schema, from its OpenAPI v3 document, and whether
    Kubernetes documents its gang policy as immutable (immutability is checked in code, not in
    the schema)."""
    owner = f"io.k8s.api.scheduling.{api_version.split('/')[1]}.PodGroup"
    out = k8s_schemas.structural(document, version, {"podGroup": (owner, ("spec",))})
    spec = document["components"]["schemas"][f"{owner}Spec"]
    out["source"] = source(api_version)
    out["schedulingPolicyImmutable"] = (
        "This field is immutable." in spec["properties"]["schedulingPolicy"]["description"]
    )
    return out


def load(api_version: str) -> dict[str, Any]:
    path = next(path for (version, _), path in SCHEMAS.items() if version == api_version)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@functools.cache
def _validator(api_version: str) -> Callable[[Any], Any]:
    formats: dict[str, Callable[[str], bool]] = {name: lambda _: True for name in ("int32", "int64")}
    compiled: Callable[[Any], Any] = fastjsonschema.compile(
        k8s_schemas.closed(load(api_version)["podGroup"]["spec"]), formats=formats
    )
    return compiled


def check_spec(api_version: str, spec: dict[str, Any]) -> None:
    """Raise fastjsonschema's error when `spec` is no valid PodGroup spec of `api_version`."""
    _validator(api_version)(spec)
