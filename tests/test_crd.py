"""The committed CRD is exactly what the models generate, and it accepts what the models accept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from cases import INVALID_JOBS
from support.jobs import valid_job

from kubetrain.api import crd, manifest, naming
from kubetrain.api.podtemplate import VENDORED_MARK

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parent.parent
COMMITTED = ROOT / "crds" / f"{naming.CRD_NAME}.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def schema() -> dict[str, Any]:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_the_models() -> None:
    generated = crd.crd_yaml()
    assert COMMITTED.read_text() == generated, (
        "crds/ drifted from api/models.py: run `kubetrain crd > crds/trainingjobs.kubetrain.dev.yaml`"
    )


def test_cli_prints_the_same_crd() -> None:
    kubetrain = Path(sys.executable).parent / "kubetrain"
    out = subprocess.run([str(kubetrain), "crd"], capture_output=True, text=True, check=True)
    assert out.stdout == COMMITTED.read_text()


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for name, child in node.get("properties", {}).items():
        found += walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += walk(node["additionalProperties"], f"{path}{{}}")
    return found


def vendored_paths() -> list[str]:
    """Where the CRD inlines Kubernetes' own schemas (api/k8s_schemas.py)."""
    stubs = crd.openapi_schema(vendored=False)
    return [path for path, node in walk(stubs) if VENDORED_MARK in node]


def test_schema_is_structural_and_bounded() -> None:
    vendored = vendored_paths()
    assert ".spec.template.spec.volumes" in vendored and ".spec.template.spec.containers[].volumeMounts" in vendored
    for path, node in walk(schema()):
        if any(path.startswith(f"{root}.") or path.startswith(f"{root}[]") for root in vendored):
            continue  # Kubernetes' types, as the apiserver publishes them; their lists are bounded here
        if path == ".metadata":
            assert node == {"type": "object"}
            continue
        if path in (".apiVersion", ".kind"):
            continue  # the API server owns these
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        assert "$ref" not in node and "title" not in node, path
        if node.get("type") == "string" and "enum" not in node and "format" not in node:
            assert "maxLength" in node, f"{path}: every free string needs maxLength (CEL cost, etcd size)"
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path}: every list needs maxItems"
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, f"{path}: every map needs maxProperties"
        if path.startswith(".spec") and node.get("type") == "integer":
            assert "minimum" in node and "maximum" in node, f"{path}: integers need bounds"


def test_spec_has_immutability_and_cross_field_rules() -> None:
    rules = [rule["rule"] for rule in schema()["properties"]["spec"]["x-kubernetes-validations"]]
    assert any("oldSelf.nodes" in rule for rule in rules)
    assert any("nccl" in rule for rule in rules)
    root_rules = [rule["rule"] for rule in schema()["x-kubernetes-validations"]]
    assert any(f"<= {naming.MAX_JOB_NAME}" in rule for rule in root_rules)


def test_crd_fits_a_client_side_apply() -> None:
    """`kubectl apply` (client-side) stores the whole object as JSON in an annotation of at most
    256 KiB; the vendored pod schemas are the bulk of it."""
    size = len(json.dumps(crd.crd(), separators=(",", ":")))
    assert size < 200_000, f"the CRD is {size} bytes as JSON: drop descriptions or use kubectl apply --server-side"


def test_printer_columns_and_status_subresource() -> None:
    version = crd.crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    names = [column["name"] for column in version["additionalPrinterColumns"]]
    for wanted in ("Phase", "Nodes", "GPUs", "Step", "Restarts", "Age"):
        assert wanted in names


def job_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == "TrainingJob"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_crd_schema(path: Path) -> None:
    # OpenAPI v3.0 schemas are draft-4 JSON Schema plus extensions (boolean exclusiveMinimum).
    validator = jsonschema.Draft4Validator(schema())
    for document in job_documents(path):
        validator.validate(document)


def test_valid_job_passes_the_schema() -> None:
    jsonschema.Draft4Validator(schema()).validate(valid_job())


@pytest.mark.parametrize(("case_id", "document", "field"), INVALID_JOBS, ids=[c[0] for c in INVALID_JOBS])
def test_models_and_schema_agree_on_invalid_jobs(case_id: str, document: dict, field: str) -> None:
    """Cases the plain schema can decide (no CEL, no unknown-field pruning) must fail it too."""
    with pytest.raises(manifest.InvalidTrainingJob):
        manifest.parse(document)
    errors = list(jsonschema.Draft4Validator(schema()).iter_errors(document))
    decidable = not any(
        word in case_id
        for word in (
            *("unknown", "reserved", "nccl", "bf16", "volumes", "name-", "gpu-in", "value-and", "shm-size"),
            *("matcher", "zero-with-in", "duplicate"),  # CEL and list-type set: the API server decides
            "rule",  # spec.template: kubetrain's own rules are CEL
        )
    )
    if decidable:
        assert errors, f"{case_id}: the CRD schema accepts what the models reject"
