"""Read TrainingJob manifests from YAML files and turn validation errors into one clear message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .api import TrainingJob


class InvalidTrainingJob(ValueError):
    """A manifest that is not a valid TrainingJob; the message names every bad field."""


def describe_errors(error: ValidationError, root: str = "") -> str:
    lines = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"]) or "(document)"
        if root:
            location = f"{root}.{location}" if item["loc"] else root
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field (not part of the TrainingJob API)"
        lines.append(f"  {location}: {message}")
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
