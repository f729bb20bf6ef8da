"""Generate the TrainingJob CRD from the pydantic models (pure; `kubetrain crd` prints it).

pydantic emits JSON Schema (2020-12 flavour, `$ref`s, `anyOf` with null for optionals);
a CRD needs a *structural* OpenAPI v3.0 schema: everything inlined, every node typed,
optional meaning "may be absent" rather than nullable, and the Kubernetes extensions
(`x-kubernetes-*`) carried through. This module is that translation and nothing else.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

from kubetrain.api import k8s_schemas, naming
from kubetrain.api.models import QUANTITY_MAX_LENGTH, TrainingJob
from kubetrain.api.podtemplate import VENDORED_MARK

INT_OR_STRING = "x-kubernetes-int-or-string"
VALIDATIONS = "x-kubernetes-validations"
QUANTITY_RULE = {
    "rule": "type(self) == int || isQuantity(string(self))",
    "message": "must be a quantity such as 2, 500m or 16Gi",
}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.nodes", "description": "Nodes (with elastic: the most)"},
    {"name": "Min", "type": "integer", "jsonPath": ".spec.elastic.minNodes", "description": "Fewest nodes (elastic)"},
    {"name": "Size", "type": "integer", "jsonPath": ".status.size", "description": "Nodes training now (elastic)"},
    {"name": "GPUs", "type": "integer", "jsonPath": ".spec.gpusPerNode", "description": "GPUs per node"},
    {"name": "Epoch", "type": "integer", "jsonPath": ".status.progress.epoch"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Done%", "type": "integer", "jsonPath": ".status.progress.percent"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss", "priority": 1},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {
        "name": "Uncounted",
        "type": "integer",
        "jsonPath": ".status.uncountedRestarts",
        "description": "Gang restarts not counted against maxRestarts (disruptions)",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Waiting-On",
        "type": "string",
        "jsonPath": ".status.timeline.waitingOn",
        "description": "What the current attempt waits on before its first step (status.timeline)",
        "priority": 1,
    },
]


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").rsplit("/", 1)[-1]])
        # The field's own description and default win over the model's docstring.
        target.update(node)
        node = target
    if node.get(INT_OR_STRING):
        return _int_or_string(node)
    for junctor in ("anyOf", "oneOf"):
        if junctor in node:
            options = [option for option in node.pop(junctor) if option != {"type": "null"}]
            if len(options) != 1:
                raise ValueError(f"cannot express a union in a structural schema: {options}")
            merged = dict(options[0])
            merged.update(node)
            return _resolve(merged, defs)
    node.pop("title", None)
    if node.get("default", "unset") is None:
        node.pop("default")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node[bound], bool):
            node[inclusive] = node.pop(bound)
            node[bound] = True
    if node.get("additionalProperties") is False:
        node.pop("additionalProperties")
    key_schema = node.pop("propertyNames", None)
    if key_schema and "maxLength" in key_schema:
        node.setdefault(VALIDATIONS, []).append(
            {
                "rule": f"self.all(k, k.size() <= {key_schema['maxLength']})",
                "message": f"keys must be at most {key_schema['maxLength']} characters",
            }
        )
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    return {key: _resolve(value, defs) if key not in ("default", "enum") else value for key, value in node.items()}


def _int_or_string(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {INT_OR_STRING: True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
    for key in ("description", "default"):
        if node.get(key) is not None:
            out[key] = node[key]
    # maxLength applies to the string form only; without it the API server estimates the
    # rule's cost for an unbounded string and refuses the CRD (cost budget exceeded).
    out["maxLength"] = QUANTITY_MAX_LENGTH
    out[VALIDATIONS] = [dict(QUANTITY_RULE)]
    return out


def _prepare_properties(schema: dict[str, Any], root: bool = False) -> None:
    """Structural schemas must say what happens to the fields of an object they do not list."""
    if schema.get("type") == "object" and "properties" not in schema and "additionalProperties" not in schema:
        schema["x-kubernetes-preserve-unknown-fields"] = True
    for name, child in schema.get("properties", {}).items():
        if not (root and name == "metadata"):
            _prepare_properties(child)
    if isinstance(schema.get("additionalProperties"), dict):
        _prepare_properties(schema["additionalProperties"])
    if isinstance(schema.get("items"), dict):
        _prepare_properties(schema["items"])


def _inline_vendored(node: Any) -> Any:
    """Replace each `VENDORED_MARK` node by Kubernetes' schema of that field, keeping the
    node's own description, bounds and CEL rules on top."""
    if isinstance(node, list):
        return [_inline_vendored(item) for item in node]
    if not isinstance(node, dict):
        return node
    if VENDORED_MARK in node:
        own = dict(node)
        group, field = own.pop(VENDORED_MARK).split(".")
        vendored = k8s_schemas.schema(group, field)
        rules = vendored.pop(VALIDATIONS, []) + own.pop(VALIDATIONS, [])
        return {**vendored, **own, **({VALIDATIONS: rules} if rules else {})}
    return {key: _inline_vendored(value) for key, value in node.items()}


def openapi_schema(vendored: bool = True) -> dict[str, Any]:
    """The CRD's schema; `vendored=False` leaves Kubernetes' own types as `VENDORED_MARK`
    stubs (the field reference names them instead of listing their hundreds of fields)."""
    raw = TrainingJob.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _resolve(raw, defs)
    schema["properties"]["apiVersion"] = {"type": "string", "description": "kubetrain.dev/v1alpha1"}
    schema["properties"]["kind"] = {"type": "string", "description": "TrainingJob"}
    # Only name/generateName may be constrained under the root metadata; the CEL rules at
    # the root carry the name limits.
    schema["properties"]["metadata"] = {"type": "object"}
    schema["required"] = ["spec"]
    schema["description"] = "A distributed PyTorch training job: a gang of pods running DDP under torchrun."
    _prepare_properties(schema, root=True)
    return _inline_vendored(schema) if vendored else schema


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": naming.CRD_NAME,
            "labels": {"app.kubernetes.io/part-of": "kubetrain"},
        },
        "spec": {
            "group": naming.GROUP,
            "names": {
                "kind": naming.KIND,
                "listKind": f"{naming.KIND}List",
                "plural": naming.PLURAL,
                "singular": naming.SINGULAR,
                "shortNames": list(naming.SHORT_NAMES),
                "categories": ["kubetrain"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": naming.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


HEADER = "# Generated by `kubetrain crd` from api/models.py. Do not edit by hand.\n"


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def crd_yaml() -> str:
    return HEADER + yaml.dump(crd(), Dumper=_NoAliasDumper, sort_keys=True, width=120, allow_unicode=True)


def _type_of(node: dict[str, Any]) -> str:
    if VENDORED_MARK in node:
        group, field = node[VENDORED_MARK].split(".")
        owner = k8s_schemas.VENDORED[group][0].rsplit(".", 1)[-1]
        return f"core/v1 {owner}.{field}"
    if node.get(INT_OR_STRING):
        return "quantity"
    kind = str(node.get("type", "object"))
    if kind == "array":
        return f"[]{_type_of(node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type_of(node['additionalProperties'])}"
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    return kind


def _bounds(node: dict[str, Any]) -> str:
    parts = []
    if "minimum" in node or "maximum" in node:
        low = node.get("minimum", "")
        high = node.get("maximum", "")
        left = "(" if node.get("exclusiveMinimum") else "["
        parts.append(f"{left}{low}, {high}]")
    for key, label in (("maxLength", "≤{} chars"), ("maxItems", "≤{} items"), ("maxProperties", "≤{} keys")):
        if key in node:
            parts.append(label.format(node[key]))
    return ", ".join(parts)


def reference_rows(node: dict[str, Any], path: str) -> list[str]:
    rows = []
    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.{name}"
        default = child.get("default")
        default_text = "" if default is None or default == {} else f"`{json.dumps(default)}`"
        description = " ".join(str(child.get("description", "")).split()).replace("|", "\\|")
        rows.append(f"| `{child_path}` | {_type_of(child)} | {default_text} | {_bounds(child)} | {description} |")
        target = child.get("items", child) if child.get("type") == "array" else child
        rows += reference_rows(target, child_path + ("[]" if child.get("type") == "array" else ""))
    return rows


def reference_markdown() -> str:
    """The spec field reference of docs/reference.md (a test keeps the two in sync)."""
    spec = openapi_schema(vendored=False)["properties"]["spec"]
    header = ["| field | type | default | bounds | description |", "|---|---|---|---|---|"]
    return "\n".join(header + reference_rows(spec, "spec")) + "\n"
