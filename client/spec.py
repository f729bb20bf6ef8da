"""What the client submits, as validated TrainingJob models: `as_job` for `submit()`'s three
inputs, `function_job` for `train()`. Pure: nothing here talks to a cluster or starts a process."""

from __future__ import annotations

import copy
import os
import re
import secrets
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubetrain.api import naming
from kubetrain.api.function import (
    CALL_FILE,
    FUNCTION_DIR,
    FUNCTION_VOLUME,
    SOURCE_FILE,
    config_map_name,
    runner_command,
)
from kubetrain.api.manifest import InvalidTrainingJob, load, parse
from kubetrain.api.models import TrainingJob
from kubetrain.client.errors import InvalidJob
from kubetrain.client.ship import Shipment

# An annotation naming the shipped function (module.qualname), for people reading the job.
FUNCTION_ANNOTATION = f"{naming.GROUP}/function"
# Set by train() from its own arguments: `spec=` may not set them too.
_TRAIN_OWNS = {
    "nodes": "nodes=",
    "gpusPerNode": "gpus_per_node=",
    "image": "image=",
    "env": "env=",
    "command": "train() (the runner of the shipped function)",
    "args": "args= and kwargs= (the function's arguments)",
}
_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
SUFFIX_LENGTH = 5  # as the API server's generateName


def as_job(job: TrainingJob | Mapping[str, Any] | str | os.PathLike[str]) -> TrainingJob:
    """A TrainingJob model, a dict (as kubectl would send it; apiVersion and kind may be left
    out) or a YAML file path, validated by the API's models; InvalidJob names every bad field."""
    try:
        if isinstance(job, TrainingJob):
            # Validated again: model_copy(update=...) and attribute-wise edits can bypass validation.
            return parse(job.wire(), "the TrainingJob")
        if isinstance(job, Mapping):
            document = {"apiVersion": naming.API_VERSION, "kind": naming.KIND, **copy.deepcopy(dict(job))}
            return parse(document, "the TrainingJob")
        if isinstance(job, str | os.PathLike):
            return load(Path(job))
    except InvalidTrainingJob as error:
        raise InvalidJob(str(error)) from None
    raise InvalidJob(f"submit() takes a TrainingJob, a dict or a YAML file path, not a {type(job).__name__}")


def random_suffix() -> str:
    return "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(SUFFIX_LENGTH))


def generated_name(stem: str) -> str:
    """`stem` made a DNS-1035 job name, plus a random suffix (as metadata.generateName would)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")
    if not slug or not slug[0].isalpha():
        slug = f"fn-{slug}".rstrip("-")
    slug = slug[: naming.MAX_JOB_NAME - SUFFIX_LENGTH - 1].rstrip("-")
    return f"{slug}-{random_suffix()}"


def function_job(
    shipment: Shipment,
    *,
    name: str,
    origin: str,
    nodes: int,
    gpus_per_node: int,
    image: str | None,
    env: Mapping[str, str] | None,
    spec: Mapping[str, Any] | None,
) -> TrainingJob:
    """The TrainingJob that runs a shipment on every rank: `runner_command()` as its command and
    the shipment's ConfigMap (`config_map_name(name)`) mounted at FUNCTION_DIR through
    spec.template. `spec` adds other spec fields (camelCase, as in YAML)."""
    extra = copy.deepcopy(dict(spec or {}))
    for key, how in _TRAIN_OWNS.items():
        if key in extra:
            raise InvalidJob(f"spec.{key}: set by {how}, not through spec=")
    document: dict[str, Any] = {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": name, "annotations": {FUNCTION_ANNOTATION: origin}},
        "spec": {
            **extra,
            "nodes": nodes,
            "gpusPerNode": gpus_per_node,
            "command": runner_command(),
            "template": _with_function_volume(extra.get("template"), config_map_name(name)),
        },
    }
    if image is not None:
        document["spec"]["image"] = image
    if env:
        document["spec"]["env"] = [{"name": key, "value": value} for key, value in env.items()]
    try:
        return parse(document, f"the job of train({shipment.call.function})")
    except InvalidTrainingJob as error:
        raise InvalidJob(str(error)) from None


def _with_function_volume(template: Any, config_map: str) -> dict[str, Any]:
    """spec.template plus the ConfigMap volume and the trainer container's read-only mount."""
    if template is not None and not isinstance(template, dict):
        raise InvalidJob(f"spec.template: expected a mapping (a PodTemplateSpec fragment), got {template!r}")
    merged: dict[str, Any] = copy.deepcopy(template or {})
    pod = merged.setdefault("spec", {})
    pod.setdefault("volumes", []).append({"name": FUNCTION_VOLUME, "configMap": {"name": config_map}})
    containers = pod.setdefault("containers", [])
    trainer = next((c for c in containers if c.get("name") == naming.CONTAINER_NAME), None)
    if trainer is None:
        trainer = {"name": naming.CONTAINER_NAME}
        containers.append(trainer)
    trainer.setdefault("volumeMounts", []).append(
        {"name": FUNCTION_VOLUME, "mountPath": FUNCTION_DIR, "readOnly": True}
    )
    return merged


def function_files(shipment: Shipment) -> dict[str, str]:
    """The ConfigMap's data: the files the runner reads (kubetrain.api.function)."""
    return {SOURCE_FILE: shipment.source, CALL_FILE: shipment.call_json}
