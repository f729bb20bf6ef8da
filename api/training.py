"""The built-in trainer's configuration: one definition for the CRD, the pods and local runs.

This module must import without torch: the operator imports it to build the CRD's
`spec.training` and `spec.checkpoint` schema, and the operator image ships no torch.

The trainer process receives its whole configuration as one JSON document in the
environment variable `KUBETRAIN_CONFIG` (rendered by the operator), or from a YAML/JSON
file given with `--config`. Field names are camelCase, exactly as in the TrainingJob.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from kubetrain.api.contract import CONFIG_ENV as CONFIG_ENV

Backend = Literal["auto", "nccl", "gloo"]


def to_camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


class StrictModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )

    def wire(self) -> dict[str, Any]:
        """The camelCase document as it appears in YAML, without unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class TrainingSpec(StrictModel):
    """What the built-in trainer trains, and how. Ignored when `command` runs your own script."""

    model: Literal["mlp", "cnn"] = Field(
        "mlp", description="Model architecture: `mlp` (two hidden layers) or `cnn` (two conv layers)."
    )
    hidden_size: int = Field(128, ge=8, le=8192, description="Width of the hidden layers / conv channels x8.")
    dataset: Literal["digits", "synthetic"] = Field(
        "digits",
        description=(
            "`digits`: scikit-learn's bundled 8x8 handwritten digits (1797 images, shipped with the "
            "package, nothing downloaded). `synthetic`: random separable data for benchmarks."
        ),
    )
    synthetic_samples: int = Field(
        8192, ge=64, le=10_000_000, description="Number of samples when `dataset` is `synthetic`."
    )
    synthetic_features: int = Field(
        64, ge=4, le=65_536, description="Features per sample when `dataset` is `synthetic`."
    )
    test_fraction: float = Field(
        0.2, gt=0.0, le=0.5, description="Fraction of the dataset held out for evaluation after each epoch."
    )
    epochs: int = Field(10, ge=1, le=100_000, description="Number of passes over the training set.")
    max_steps: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        description="Stop after this many optimizer steps even if epochs remain (quick experiments).",
    )
    batch_size: int = Field(
        32,
        ge=1,
        le=65_536,
        description=(
            "Micro-batch per process: the most samples one forward pass takes. Without globalBatchSize the "
            "global batch is this x worldSize x gradAccumSteps."
        ),
    )
    global_batch_size: int | None = Field(
        None,
        ge=1,
        le=1 << 30,
        description=(
            "Samples per optimizer step, the same at any number of processes: each process trains its share in "
            "micro-batches of batchSize, accumulating as many as it needs (gradAccumSteps is then ignored). Set "
            "it, and a checkpoint resumes at another world size: every sample of an epoch is still trained once."
        ),
    )
    learning_rate: float = Field(0.01, gt=0.0, le=10.0, description="Peak learning rate.")
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="Optimizer.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="Decoupled weight decay.")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "cosine", description="`cosine` decays to zero over the whole run; `constant` keeps the peak."
    )
    grad_accum_steps: int = Field(
        1,
        ge=1,
        le=1024,
        description="Micro-batches per optimizer step; gradients sync only on the last one (DDP no_sync).",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for weights, shuffling and dropout.")
    drop_last: bool = Field(
        True, description="Drop each epoch's last global batch when it is short; false trains it as a shorter step."
    )
    num_workers: int = Field(0, ge=0, le=64, description="DataLoader worker processes per training process.")
    bf16: bool = Field(False, description="bf16 autocast for forward/backward (GPU only).")
    log_every_steps: int = Field(10, ge=1, le=1_000_000, description="Rank 0 logs a metrics line every N steps.")
    preflight: bool = Field(
        False, description="Run the collective-communication preflight across the whole world before training."
    )
    process_group_timeout_seconds: int = Field(
        1800, ge=10, le=86_400, description="Timeout of a collective before the process group aborts."
    )
    connect_timeout_seconds: int = Field(
        300,
        ge=1,
        le=3600,
        description="How long non-master ranks wait for MASTER_ADDR:MASTER_PORT to accept connections.",
    )


# s3://bucket or s3://bucket/prefix: S3's bucket naming rules, then a prefix without blanks.
OBJECT_STORE_URL_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?$"


class ObjectStoreConfig(StrictModel):
    """An S3 (or S3-compatible) location the checkpoints are committed to (kubetrain.trainer.objectstore)."""

    url: str = Field(
        max_length=1024,
        pattern=OBJECT_STORE_URL_PATTERN,
        description="s3://bucket/prefix the checkpoints are committed under.",
    )
    endpoint: str | None = Field(
        None,
        max_length=1024,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="Endpoint of an S3-compatible server (http(s)://host:port). Omitted: AWS S3.",
    )
    region: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="The bucket's region. Omitted: the pod's AWS_REGION, else us-east-1.",
    )


class CheckpointConfig(StrictModel):
    """Where and when the trainer writes `step-N/` checkpoints; the latest complete one is resumed."""

    dir: str = Field(
        "/checkpoints",
        min_length=1,
        max_length=1024,
        pattern=r"^\S+$",
        description=(
            "Directory the checkpoints (and rank 0's metrics.jsonl) are written to. With objectStore: "
            "where rank 0 stages each checkpoint before its upload."
        ),
    )
    object_store: ObjectStoreConfig | None = Field(
        None,
        description=(
            "Commit checkpoints to object storage instead of `dir`: staged in `dir`, uploaded in the "
            "background, resumed from the newest commit. No shared volume is needed."
        ),
    )
    every_steps: int | None = Field(
        None, ge=1, le=1_000_000_000, description="Save every N optimizer steps (in addition to each epoch end)."
    )
    every_seconds: int | None = Field(
        None,
        ge=1,
        le=31_536_000,
        description="Save once this many seconds passed since the last save (checked on log steps).",
    )
    keep: int = Field(3, ge=1, le=1000, description="Keep the newest N complete checkpoints; older ones are pruned.")


class TrainConfig(StrictModel):
    """Everything one trainer process needs besides torchrun's env contract."""

    training: TrainingSpec = Field(default_factory=TrainingSpec)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    backend: Backend = "auto"

    def to_env_value(self) -> str:
        return json.dumps(self.wire(), sort_keys=True, separators=(",", ":"))

    def fingerprint(self) -> str:
        """Identity of the computation: resuming a checkpoint made by another config is refused.

        Only fields that change the sequence of weights count; logging, checkpoint cadence and
        timeouts may change between attempts.
        """
        relevant = self.training.model_dump(
            exclude={
                "log_every_steps",
                "preflight",
                "process_group_timeout_seconds",
                "connect_timeout_seconds",
                "num_workers",
            }
        )
        if relevant.get("global_batch_size") is None:  # the fingerprints from before the field stay valid
            relevant.pop("global_batch_size", None)
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_env(cls, environ: os._Environ[str] | dict[str, str] | None = None) -> TrainConfig:
        environ = os.environ if environ is None else environ
        raw = environ.get(CONFIG_ENV)
        if not raw:
            return cls()
        return cls.model_validate_json(raw)

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data)
