"""The one TrainingJob builder of the tests: documents (dicts, as kubectl would send them), the
validated model, example files and throwaway jobs whose nodes run a short script."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from kubetrain.api.models import TrainingJob

ROOT = Path(__file__).resolve().parents[2]
DIGITS_CPU = ROOT / "examples" / "digits-cpu.yaml"
BYO_DATA = ROOT / "examples" / "byo-data.yaml"

BASE_JOB: dict[str, Any] = {
    "apiVersion": "kubetrain.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "valid-job"},
    "spec": {
        "nodes": 2,
        "gpusPerNode": 0,
        "image": "kubetrain/trainer:0.1.0-cpu",
        "training": {"model": "mlp", "dataset": "digits", "epochs": 2, "batchSize": 16},
        "checkpoint": {"everySteps": 10, "keep": 2},
        "runPolicy": {"maxRestarts": 2},
    },
}


def bare_job(
    name: str = "j", *, metadata: dict[str, Any] | None = None, status: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    """A TrainingJob document of only the spec fields given (the API's defaults for the rest:
    no image, no training, no restarts, unlike BASE_JOB); `metadata` beside the name."""
    job: dict[str, Any] = {
        "apiVersion": "kubetrain.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, **(metadata or {})},
        "spec": spec,
    }
    if status is not None:
        job["status"] = status
    return job


def valid_job(name: str = "valid-job", **spec: Any) -> dict[str, Any]:
    """BASE_JOB with top-level spec fields replaced."""
    job = copy.deepcopy(BASE_JOB)
    job["metadata"]["name"] = name
    job["spec"].update(spec)
    return job


def job_model(name: str = "valid-job", **spec: Any) -> TrainingJob:
    """`valid_job(...)` as the validated pydantic model."""
    return TrainingJob.model_validate(valid_job(name, **spec))


def training_job(path: Path = DIGITS_CPU) -> dict[str, Any]:
    """The TrainingJob document of an example file (without the PVC next to it)."""
    return next(doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == "TrainingJob")


def digits_job(**training: Any) -> dict[str, Any]:
    """examples/digits-cpu.yaml with spec.training fields replaced."""
    job = training_job()
    job["spec"]["training"].update(training)
    return job


def fake_job(script: str, *, nodes: int = 2, **spec: Any) -> dict[str, Any]:
    """A job whose nodes run a short Python script instead of the trainer (no torch)."""
    return {
        "apiVersion": "kubetrain.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "fake"},
        "spec": {"nodes": nodes, "command": [sys.executable, "-c", script], **spec},
    }


def write_job(directory: Path, job: dict[str, Any], name: str = "job.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path
