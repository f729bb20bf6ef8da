"""Read TrainingJob manifests from YAML files and turn validation errors into one clear message."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kubetrain.api.models import TrainingJob


class InvalidTrainingJob(ValueError):
    """A manifest that is not a valid TrainingJob; the message names every bad field."""


# pydantic adds the member of a union it tried to the location (`shmSize.int`); users
# never wrote those, so they are dropped.
_UNION_MEMBERS = frozenset({"int", "str", "constrained-str", "float", "bool"})
# Cross-field validators start their message with the field they blame, relative to the
# model (or field) they validate: "backend: nccl needs GPUs", "[0].name: ...".
_BLAMED_FIELD = re.compile(r"^((?:[A-Za-z][A-Za-z0-9]*|\[\d+\])(?:\.[A-Za-z][A-Za-z0-9]*|\[\d+\])*): (.*)$", re.DOTALL)


def field_path(loc: tuple[int | str, ...]) -> str:
    """`("spec", "env", 0, "name")` -> `spec.env[0].name`, the way the API server writes it."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in _UNION_MEMBERS and "[" not in part:
            path += f".{part}" if path else part
    return path


def describe_errors(error: ValidationError) -> str:
    lines: list[str] = []
    for item in error.errors():
        location = field_path(item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field (not part of the TrainingJob API)"
        blamed = _BLAMED_FIELD.match(message)
        if item["type"] == "value_error" and blamed:
            separator = "" if blamed[1].startswith("[") or not location else "."
            location = f"{location}{separator}{blamed[1]}"
            message = blamed[2]
        line = f"  {location or '(document)'}: {message}"
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


def parse(document: Any, source: str = "<document>") -> TrainingJob:
    if not isinstance(document, dict):
        raise InvalidTrainingJob(f"{source}: expected a TrainingJob mapping, got {type(document).__name__}")
    try:
        return TrainingJob.model_validate(document)
    except ValidationError as error:
        raise InvalidTrainingJob(f"{source} is not a valid TrainingJob:\n{describe_errors(error)}") from None


def load(path: str | Path) -> TrainingJob:
    """The single TrainingJob in a YAML file.

    A file may also hold the objects a job needs on a cluster (a PVC, a ConfigMap) so that
    one `kubectl apply -f` creates everything; those are left to kubectl.
    """
    path = Path(path)
    try:
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    except OSError as error:
        raise InvalidTrainingJob(f"{path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise InvalidTrainingJob(f"{path}: not valid YAML: {error}") from None
    jobs = [doc for doc in documents if not isinstance(doc, dict) or doc.get("kind", "TrainingJob") == "TrainingJob"]
    if len(jobs) != 1:
        raise InvalidTrainingJob(f"{path}: expected exactly one TrainingJob document, found {len(jobs)}")
    return parse(jobs[0], str(path))
