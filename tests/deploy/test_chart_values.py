"""The Helm chart's files without helm: every value documented and valid against the schema,
and the CRD it installs byte-identical to the generated one."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import yaml
from support.tools import CHART, ROOT

pytestmark = pytest.mark.unit


def test_values_file_matches_schema_and_is_commented() -> None:
    """Every key the schema knows is in values.yaml with a comment above it, and the reverse:
    the schema's additionalProperties: false makes an undocumented key an install error."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    values = yaml.safe_load("\n".join(lines))

    def walk(node: dict[str, Any], value: Any, path: str) -> None:
        props = node.get("properties")
        if not props:
            return
        assert isinstance(value, dict), path
        assert set(value) <= set(props), f"{path}: keys not in the schema: {set(value) - set(props)}"
        for key, sub in props.items():
            if key == "global":
                continue
            assert key in value, f"{path}{key} is in the schema but not in values.yaml"
            walk(sub, value[key], f"{path}{key}.")

    walk(schema, values, "")
    key_line = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9]*):")
    for number, line in enumerate(lines):
        match = key_line.match(line)
        if not match:
            continue
        previous = lines[number - 1].strip() if number else ""
        parent_is_data = match.group(1) and _inside_default_map(lines, number)
        if not parent_is_data:
            assert previous.startswith("#"), f"values.yaml:{number + 1}: `{line.strip()}` has no comment"


def _inside_default_map(lines: list[str], number: int) -> bool:
    """True for keys of a default value (resources.requests.cpu), which are data, not settings."""
    indent = len(lines[number]) - len(lines[number].lstrip())
    for previous in reversed(lines[:number]):
        stripped = previous.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if len(previous) - len(previous.lstrip()) < indent:
            return previous.strip() in ("requests:", "limits:")
    return False


def test_values_defaults_pass_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


def test_chart_crd_is_the_generated_crd() -> None:
    """Helm installs charts/kubetrain/crds/ verbatim: it must be byte-identical to crds/, which
    test_crd.py keeps identical to `kubetrain crd`. Regenerate with
    `kubetrain crd > crds/trainingjobs.kubetrain.dev.yaml && cp crds/*.yaml charts/kubetrain/crds/`."""
    chart_crds = sorted(p.name for p in (CHART / "crds").iterdir())
    assert chart_crds == sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    for name in chart_crds:
        assert (CHART / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
            f"charts/kubetrain/crds/{name} differs from crds/{name}: copy it over"
        )
