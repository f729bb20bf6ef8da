"""The TrainingJob API (kubetrain.dev/v1alpha1): the single source of the CRD.

`kubetrain crd` turns these models into the CRD's openAPIV3Schema (see `crd.py`); the YAML
in crds/ is generated from here and a test fails when the two drift. Cross-field and
immutability rules are written twice on purpose, once as pydantic validators (clear errors
for `kubetrain run --local` and the operator) and once as CEL in `x-kubernetes-validations`
(enforced by the API server on `kubectl apply`); the tests apply the same invalid table to
both.

Longer than our other modules on purpose: it is the declarative API, one model per CRD type
with its bounds and rules beside it; splitting it would scatter the single source of the CRD
(the pod template overlay already lives in `podtemplate.py`, the training schema in
`training.py`).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

from kubetrain.api import naming
from kubetrain.api.contract import (
    OBJECT_STORE_CREDENTIALS,
    OPTIONAL_CREDENTIALS,
    RESERVED_ENV,
    RESERVED_ENV_PREFIX,
    USER_SETTABLE,
    is_reserved,
)
from kubetrain.api.podtemplate import SPEC_RULES as TEMPLATE_RULES
from kubetrain.api.podtemplate import PodTemplate
from kubetrain.api.podtemplate import problems as template_problems
from kubetrain.api.training import (
    Backend,
    CheckpointConfig,
    ObjectStoreConfig,
    StrictModel,
    TrainConfig,
    TrainingSpec,
)

# A Kubernetes quantity: `2`, `500m`, `16Gi`. The API server gives the final verdict.
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki)?$"
_QUANTITY = re.compile(QUANTITY_PATTERN)
QUANTITY_MAX_LENGTH = 64


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and (len(value) > QUANTITY_MAX_LENGTH or not _QUANTITY.match(value)):
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as 2, 500m or 16Gi")
    return value


Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]
ShortString = Annotated[str, Field(max_length=253)]
LabelValue = Annotated[str, Field(max_length=63)]
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# The name of a namespaced object (a PVC, a ServiceAccount, a Secret): a DNS subdomain.
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
GPU_RESOURCE = "nvidia.com/gpu"

# The fields that define the computation of a running job. Changing them would make the
# next gang restart resume a checkpoint with another model, data or world size, so the API
# server refuses the update (CEL transition rules below). runPolicy, nodeSelector,
# tolerations, resources, env, shmSize, imagePullPolicy, serviceAccountName and template stay mutable
# (Kueue rewrites nodeSelector/tolerations of a suspended job); they apply from the next
# attempt on.
IMMUTABLE_FIELDS = (
    "nodes",
    "gpusPerNode",
    "image",
    "command",
    "args",
    "backend",
    "masterPort",
    "training",
    "checkpoint",
)


def _immutable_rule(field: str) -> JsonDict:
    return {
        "rule": f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        "message": f"spec.{field} is immutable: it defines the computation that checkpoints resume",
        "fieldPath": f".{field}",
    }


class SecretKeySelector(StrictModel):
    name: str = Field(max_length=253, description="Name of the Secret (or ConfigMap).")
    key: str = Field(max_length=253, description="Key inside it.")
    optional: bool | None = Field(None, description="Do not fail when the key is missing.")


class FieldSelector(StrictModel):
    field_path: str = Field(max_length=256, description="Pod field, e.g. `status.podIP` or `spec.nodeName`.")
    api_version: str | None = Field(None, max_length=64, description="Schema version of fieldPath.")


class ResourceFieldSelector(StrictModel):
    resource: str = Field(max_length=64, description="Container resource, e.g. `limits.memory`.")
    container_name: str | None = Field(None, max_length=63, description="Container; defaults to the trainer.")
    divisor: Quantity | None = Field(None, description="Output unit.")


class EnvVarSource(StrictModel):
    secret_key_ref: SecretKeySelector | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: SecretKeySelector | None = Field(None, description="A key of a ConfigMap.")
    field_ref: FieldSelector | None = Field(None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(None, description="A resource of the container.")


class EnvVar(StrictModel):
    """An environment variable for the trainer container. Rendezvous names are reserved."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.value) && has(self.valueFrom))",
                    "message": "set either value or valueFrom, not both",
                    "fieldPath": ".valueFrom",
                }
            ]
        }
    )

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str | None = Field(None, max_length=32_768, description="Literal value.")
    value_from: EnvVarSource | None = Field(None, description="Take the value from a Secret, ConfigMap or field.")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if is_reserved(name):
            raise ValueError(
                f"{name!r} is reserved: kubetrain sets the rendezvous variables "
                f"({', '.join(sorted(RESERVED_ENV))}) and every {RESERVED_ENV_PREFIX}* name itself "
                f"but {' and '.join(USER_SETTABLE)}"
            )
        return name

    @model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError("valueFrom: set either value or valueFrom, not both")
        return self


class Resources(StrictModel):
    """Per-node CPU/memory (and other) resources. GPUs come from gpusPerNode; requests equal limits."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!has(self.{part}) || !('{GPU_RESOURCE}' in self.{part})",
                    "message": f"do not set {GPU_RESOURCE} here; use spec.gpusPerNode",
                    "fieldPath": f".{part}",
                }
                for part in ("requests", "limits")
            ]
        }
    )

    requests: dict[Annotated[str, Field(max_length=253)], Quantity] | None = Field(
        None, max_length=16, description="Requested resources; limits default to these."
    )
    limits: dict[Annotated[str, Field(max_length=253)], Quantity] | None = Field(
        None, max_length=16, description="Resource limits."
    )

    @model_validator(mode="after")
    def _no_gpus_here(self) -> Resources:
        for part in ("requests", "limits"):
            if GPU_RESOURCE in (getattr(self, part) or {}):
                raise ValueError(f"{part}: do not set {GPU_RESOURCE} here; use spec.gpusPerNode")
        return self


class Toleration(StrictModel):
    key: str | None = Field(None, max_length=316, description="Taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal (default).")
    value: str | None = Field(None, max_length=63, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="Taint effect.")
    toleration_seconds: int | None = Field(
        None, ge=0, le=31_536_000, description="How long a NoExecute taint is tolerated."
    )


class PersistentVolumeClaimRef(StrictModel):
    claim_name: str = Field(max_length=253, pattern=OBJECT_NAME_PATTERN, description="Name of an existing PVC.")


class EmptyDirVolume(StrictModel):
    size_limit: Quantity | None = Field(None, description="Size limit of the emptyDir.")


class CheckpointVolume(StrictModel):
    """Exactly one of persistentVolumeClaim or emptyDir.

    Only a PVC survives a gang restart (pods are deleted and recreated); an emptyDir is
    lost with them and the job restarts from step 0. Multi-node jobs need ReadWriteMany.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.persistentVolumeClaim) != has(self.emptyDir)",
                    "message": "set exactly one of persistentVolumeClaim or emptyDir",
                }
            ]
        }
    )

    persistent_volume_claim: PersistentVolumeClaimRef | None = Field(None, description="Mount this PVC.")
    empty_dir: EmptyDirVolume | None = Field(None, description="A scratch emptyDir (lost on gang restart).")

    @model_validator(mode="after")
    def _exactly_one(self) -> CheckpointVolume:
        if (self.persistent_volume_claim is None) == (self.empty_dir is None):
            raise ValueError("set exactly one of persistentVolumeClaim or emptyDir")
        return self


_CREDENTIAL_KEYS = ", ".join(name for name in OBJECT_STORE_CREDENTIALS if name not in OPTIONAL_CREDENTIALS)
_OPTIONAL_KEYS = ", ".join(sorted(OPTIONAL_CREDENTIALS))


class ObjectStoreSpec(ObjectStoreConfig):
    """The object store as the cluster sees it: where the credentials come from, besides where
    the checkpoints go. Only the pods' env carries them, never the trainer's configuration."""

    credentials_secret: str | None = Field(
        None,
        max_length=253,
        pattern=OBJECT_NAME_PATTERN,
        description=(
            f"A Secret in the job's namespace with the keys {_CREDENTIAL_KEYS} (and optionally {_OPTIONAL_KEYS}), "
            "given to the training containers as the variables of the same names. Omitted: the pods' own "
            "credentials (IRSA, workload identity, or env your job sets)."
        ),
    )


class CheckpointSpec(CheckpointConfig):
    # The trainer's field, with the cluster's credentials beside it.
    object_store: ObjectStoreSpec | None = Field(
        None, description=CheckpointConfig.model_fields["object_store"].description
    )
    volume: CheckpointVolume | None = Field(
        None,
        description=(
            "Volume mounted at `dir` in every node's pod. Omitted: an emptyDir (no resume across restarts, "
            "unless objectStore holds the checkpoints: the emptyDir is then only their staging area)."
        ),
    )

    def trainer_config(self) -> CheckpointConfig:
        """What the trainer gets: no volume, and no credentials (those reach the pods as env)."""
        dropped: dict[str, Any] = {"volume": True, "object_store": {"credentials_secret"}}
        return CheckpointConfig.model_validate(self.model_dump(exclude=dropped))


def _cel(rule: str, message: str, field_path: str | None = None) -> ConfigDict:
    """A model's config carrying one CEL rule for the CRD (its pydantic twin is a validator)."""
    validation: JsonDict = {"rule": rule, "message": message}
    if field_path:
        validation["fieldPath"] = field_path
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": [validation]})


FailureAction = Literal["FailJob", "RestartJob", "RestartJobAndIgnoreMaxRestarts"]
MAX_EXIT_CODE = 255


class ExitCodesRequirement(StrictModel):
    """Kubernetes' podFailurePolicy onExitCodes: the trainer container's exit code In (or NotIn) `values`."""

    model_config = _cel(
        "self.operator != 'In' || !(0 in self.values)",
        "exit code 0 is success: it may not be listed with operator In",
        ".values",
    )

    operator: Literal["In", "NotIn"] = Field(
        description="In: the exit code is one of `values`. NotIn: it is not (exit code 0 never matches)."
    )
    values: list[Annotated[int, Field(ge=0, le=MAX_EXIT_CODE)]] = Field(
        min_length=1,
        max_length=MAX_EXIT_CODE,
        description="Exit codes, each listed once.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @model_validator(mode="after")
    def _sensible(self) -> ExitCodesRequirement:
        if len(set(self.values)) != len(self.values):
            raise ValueError("values: each exit code may be listed once")
        if self.operator == "In" and 0 in self.values:
            raise ValueError("values: exit code 0 is success: it may not be listed with operator In")
        return self


class PodConditionPattern(StrictModel):
    """Kubernetes' podFailurePolicy onPodConditions entry: a pod condition and its status."""

    type: str = Field(
        max_length=316,
        pattern=r"^[A-Za-z][A-Za-z0-9]*$",
        description="Pod condition type, e.g. DisruptionTarget (eviction, preemption, node drain).",
    )
    status: Literal["True", "False", "Unknown"] = Field("True", description="The status it must have.")


class FailurePolicyRule(StrictModel):
    """One rule: an action and exactly one of onExitCodes, onPodConditions or onFailureReasons."""

    model_config = _cel(
        "[has(self.onExitCodes), has(self.onPodConditions), has(self.onFailureReasons)].exists_one(x, x)",
        "set exactly one of onExitCodes, onPodConditions or onFailureReasons",
    )

    action: FailureAction = Field(
        description=(
            "FailJob: fail at once. RestartJob: restart the gang, counted against maxRestarts. "
            "RestartJobAndIgnoreMaxRestarts: restart the gang without counting it (status.uncountedRestarts)."
        )
    )
    on_exit_codes: ExitCodesRequirement | None = Field(None, description="Match the failed pod's exit code.")
    on_pod_conditions: list[PodConditionPattern] | None = Field(
        None, min_length=1, max_length=8, description="Match a pod that has any of these conditions."
    )
    on_failure_reasons: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="Match the failure's reason as status.failures[] records it: Stalled, OOMKilled, ...",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @model_validator(mode="after")
    def _one_matcher(self) -> FailurePolicyRule:
        matchers = (self.on_exit_codes, self.on_pod_conditions, self.on_failure_reasons)
        if sum(m is not None for m in matchers) != 1:
            raise ValueError("set exactly one of onExitCodes, onPodConditions or onFailureReasons")
        return self


class FailurePolicy(StrictModel):
    """What a gang failure leads to, after Kubernetes' podFailurePolicy and JobSet's failurePolicy.

    The first rule that matches decides. Then the defaults: a disruption (pod condition
    DisruptionTarget, or reason Evicted, Preempted, NodeLost or Terminated) restarts the gang
    without counting it; anything else restarts it, counted against maxRestarts.
    """

    rules: list[FailurePolicyRule] = Field(
        default_factory=list, max_length=20, description="Checked in order; the first match decides."
    )


RestartStrategy = Literal["InPlace", "Recreate"]


class RunPolicy(StrictModel):
    """How long, how often and when a job runs. All fields may change while the job runs."""

    max_restarts: int = Field(
        3, ge=0, le=1000, description="Gang restarts allowed before the job fails with BackoffLimitExceeded."
    )
    active_deadline_seconds: int | None = Field(
        None, ge=1, le=31_536_000, description="Fail with DeadlineExceeded this long after the job started."
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, le=31_536_000, description="Delete the finished TrainingJob (and its children) after this long."
    )
    clean_pod_policy: Literal["All", "Running", "None"] = Field(
        "Running",
        description=(
            "Which pods to delete when the job finishes: `Running` (those still running, so finished "
            "pods keep their logs), `All`, or `None`."
        ),
    )
    scheduling_timeout_seconds: int | None = Field(
        None, ge=1, le=31_536_000, description="Fail with Unschedulable when a pod stays Pending this long."
    )
    suspend: bool = Field(
        False, description="Delete the pods and hold the job (Kueue-compatible); unsuspending resumes it."
    )
    failure_policy: FailurePolicy | None = Field(
        None, description="Which failures fail the job at once, restart the gang, or restart it without counting."
    )
    hang_timeout_seconds: int | None = Field(
        None,
        ge=1,
        le=31_536_000,
        description=(
            "Restart the gang (failure reason Stalled) when rank 0's progress has not advanced this long "
            "while every pod runs, counted from rank 0's first record of the attempt (start-up is "
            "startupTimeoutSeconds'). Needs rank 0's metrics records; off when omitted."
        ),
    )
    startup_timeout_seconds: int | None = Field(
        None,
        ge=1,
        le=31_536_000,
        description=(
            "Restart the gang (failure reason Stalled) when rank 0 has written no record this long after "
            "every pod of the attempt runs: imports, rendezvous, data, model and checkpoint loading. "
            "Default with hangTimeoutSeconds: the larger of it and 600 (torch's own process-group "
            "timeout); off when both are omitted."
        ),
    )
    restart_strategy: RestartStrategy = Field(
        "InPlace",
        description=(
            "How a gang restart runs when every pod of the gang is still there. `InPlace` (default): the pods "
            "stay and the torchrun agent in each restarts its workers (a Python exception, a crashed or stalled "
            "worker); a lost, deleted or evicted pod, or an in-place attempt that does not rendezvous in time, "
            "recreates the gang. Needs kubetrain's torchrun hooks, which every pod gets (spec.runtime.inject, or "
            "an image with kubetrain); a pod without them never turns Ready and its failures recreate the gang. "
            "`Recreate`: every restart deletes and recreates the pods."
        ),
    )


GangMode = Literal["auto", "native", "coscheduling", "none"]


class SchedulingSpec(StrictModel):
    """How the gang is placed. Applies from the next attempt on (a pod's scheduling group is
    immutable)."""

    gang: GangMode = Field(
        "auto",
        description=(
            "`native`: one scheduling.k8s.io PodGroup per attempt (v1beta1 where served, else v1alpha2; gang "
            "policy, minCount = nodes) so kube-scheduler binds all pods or none; the job fails if neither is "
            "served. An elastic job gets one PodGroup for its life with minCount = elastic.minNodes: its first "
            "minNodes pods are placed together, the others one by one. `coscheduling`: the same with the "
            "scheduling.x-k8s.io/v1alpha1 PodGroup (minMember = nodes) of scheduler-plugins' Coscheduling plugin "
            "(not for elastic jobs). `none`: pods are scheduled one by one. `auto` (default): native when its API "
            "is served and schedulerName is unset or default-scheduler, else none."
        ),
    )


_CREDENTIALS_TWICE = (
    f"env may not set {', '.join(OBJECT_STORE_CREDENTIALS[:-1])} or {OBJECT_STORE_CREDENTIALS[-1]} while "
    "checkpoint.objectStore.credentialsSecret gives them: set the credentials in one place"
)


class RuntimeSpec(StrictModel):
    inject: bool = Field(
        True,
        description=(
            "Give the trainer container kubetrain's runtime (torchrun hooks, in-place restart agent, stop vote, "
            "hang watchdog, Hugging Face and Lightning adapters) from an init container, loaded through "
            "PYTHONPATH, so that an image without kubetrain gets them; an image with kubetrain uses its own. "
            "false: the image's Python is left as it is (an image without kubetrain then gets no in-place "
            "restart: use runPolicy.restartStrategy Recreate). See docs/images.md."
        ),
    )


class ElasticPolicy(StrictModel):
    """A node range: the gang trains with the pods that can run, from minNodes up to `nodes`."""

    min_nodes: int = Field(
        ge=1,
        le=naming.MAX_NODES,
        description=(
            "The fewest nodes the job trains with. A lost node (its pod deleted, evicted, preempted, failed) "
            "while at least this many remain shrinks the gang in place at its next attempt, counted against no "
            "budget; the lost pod is created again and waits for capacity. Fewer than this: the job waits "
            "(condition BelowMinNodes) until they are back. See docs/elastic.md."
        ),
    )
    scale_up_cooldown_seconds: int = Field(
        60,
        ge=0,
        le=86_400,
        description=(
            "After a resize, how long the gang trains at its size before a waiting pod that can run grows it "
            "(at a step boundary, through the stop vote): flapping capacity does not thrash the gang."
        ),
    )


def _elastic_problem(spec: TrainingJobSpec) -> str | None:
    """Why spec.elastic cannot be had with the rest of the spec (the pydantic twin of the CEL rules)."""
    elastic = spec.elastic
    if elastic is None:
        return None
    if elastic.min_nodes > spec.nodes:
        return f"elastic.minNodes: {elastic.min_nodes} is more than nodes ({spec.nodes}), the most the gang grows to"
    if spec.scheduling.gang == "coscheduling":
        return (
            "elastic: scheduling.gang coscheduling would hold every pod until all fit (scheduler-plugins' "
            "minMember is fixed): use auto, native (a PodGroup whose minCount is minNodes) or none"
        )
    if spec.run_policy.restart_strategy != "InPlace":
        return "elastic: a resize restarts the gang in place: runPolicy.restartStrategy must be InPlace"
    if spec.command is None and spec.training.global_batch_size is None:
        return (
            "elastic: the built-in trainer needs training.globalBatchSize, so that every size trains the same "
            "global batch and a checkpoint resumes at another size"
        )
    return None


ELASTIC_RULES: list[JsonDict] = [
    {
        "rule": "!has(self.elastic) || self.elastic.minNodes <= self.nodes",
        "message": "elastic.minNodes may not be more than nodes, the most the gang grows to",
        "fieldPath": ".elastic.minNodes",
    },
    {
        "rule": "!has(self.elastic) || !has(self.runPolicy) || !has(self.runPolicy.restartStrategy) || "
        "self.runPolicy.restartStrategy == 'InPlace'",
        "message": "elastic: a resize restarts the gang in place: runPolicy.restartStrategy must be InPlace",
        "fieldPath": ".elastic",
    },
    {
        "rule": "!has(self.elastic) || !has(self.scheduling) || !has(self.scheduling.gang) || "
        "self.scheduling.gang != 'coscheduling'",
        "message": "elastic: scheduling.gang coscheduling would hold every pod until all fit: use auto, native "
        "(a PodGroup whose minCount is minNodes) or none",
        "fieldPath": ".scheduling.gang",
    },
    {
        "rule": "!has(self.elastic) || has(self.command) || (has(self.training) && has(self.training.globalBatchSize))",
        "message": "elastic: the built-in trainer needs training.globalBatchSize, so that every size trains the same "
        "global batch",
        "fieldPath": ".elastic",
    },
]


class TrainingJobSpec(StrictModel):
    """A gang of `nodes` pods, each running `gpusPerNode` processes under torchrun."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(self.backend == 'nccl' && self.gpusPerNode == 0)",
                    "message": "backend nccl needs GPUs: set gpusPerNode >= 1 or backend gloo/auto",
                    "fieldPath": ".backend",
                },
                {
                    "rule": "!(self.training.bf16 && self.gpusPerNode == 0)",
                    "message": "training.bf16 needs GPUs: set gpusPerNode >= 1",
                    "fieldPath": ".training.bf16",
                },
                {
                    "rule": "!(has(self.checkpoint) && has(self.checkpoint.objectStore) && "
                    "has(self.checkpoint.objectStore.credentialsSecret) && has(self.env) && "
                    "self.env.exists(e, e.name in " + repr(list(OBJECT_STORE_CREDENTIALS)).replace('"', "'") + "))",
                    "message": _CREDENTIALS_TWICE,
                    "fieldPath": ".env",
                },
                *[_immutable_rule(field) for field in IMMUTABLE_FIELDS],
                *ELASTIC_RULES,
                *TEMPLATE_RULES,
            ]
        }
    )

    nodes: int = Field(
        1,
        ge=1,
        le=naming.MAX_NODES,
        description="Number of pods (torchrun nodes) in the gang; with `elastic`, the most it grows to.",
    )
    elastic: ElasticPolicy | None = Field(
        None, description="Train on the nodes there are, from elastic.minNodes up to `nodes` (docs/elastic.md)."
    )
    gpus_per_node: int = Field(
        0, ge=0, le=16, description="GPUs per pod; one process per GPU. 0 runs one CPU process per pod with gloo."
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        description="Container image. Omitted: the operator's default trainer image.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Pull policy of the trainer container."
    )
    command: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        None,
        max_length=64,
        description="Container command. Omitted: torchrun running the built-in trainer, one process per GPU.",
    )
    args: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        None, max_length=256, description="Arguments to the command."
    )
    env: list[EnvVar] | None = Field(
        None,
        max_length=128,
        description=(
            "Extra environment. The rendezvous variables and KUBETRAIN_* names are reserved, but for "
            f"{USER_SETTABLE[0]} (the fault-injection drill) and {USER_SETTABLE[1]} (the sample ledger)."
        ),
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(e, !(e.name in "
                    + repr(sorted(RESERVED_ENV)).replace('"', "'")
                    + f") && (!e.name.startsWith('{RESERVED_ENV_PREFIX}') || e.name in "
                    + repr(list(USER_SETTABLE)).replace('"', "'")
                    + "))",
                    "message": "env may not set the rendezvous variables or KUBETRAIN_* names but "
                    f"{' and '.join(USER_SETTABLE)}: "
                    "kubetrain sets them",
                }
            ],
        },
    )
    resources: Resources | None = Field(None, description="Per-node resources besides GPUs.")
    node_selector: dict[Annotated[str, Field(max_length=316)], LabelValue] | None = Field(
        None, max_length=64, description="Schedule the pods only on nodes with these labels."
    )
    tolerations: list[Toleration] | None = Field(None, max_length=32, description="Tolerations of the pods.")
    service_account_name: str | None = Field(
        None,
        max_length=253,
        pattern=OBJECT_NAME_PATTERN,
        description="ServiceAccount the pods run as.",
    )
    scheduler_name: str | None = Field(
        None, max_length=253, description="Scheduler for the pods (e.g. a gang scheduler such as volcano)."
    )
    priority_class_name: str | None = Field(None, max_length=253, description="PriorityClass of the pods.")
    shm_size: Quantity = Field(
        "1Gi", description="Size of the memory-backed /dev/shm (DataLoader workers and NCCL need more than 64Mi)."
    )
    master_port: int = Field(29500, ge=1024, le=65535, description="Rendezvous port of node 0.")
    backend: Backend = Field(
        "auto", description="Process-group backend: auto (nccl with GPUs, else gloo), nccl or gloo."
    )
    training: TrainingSpec = Field(
        default_factory=TrainingSpec,
        description="The built-in trainer's configuration.",
        json_schema_extra={"default": {}},
    )
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,
        description="Checkpoint location and cadence; the trainer resumes the latest complete one.",
        json_schema_extra={"default": {}},
    )
    run_policy: RunPolicy = Field(
        default_factory=RunPolicy, description="Restarts, deadlines and cleanup.", json_schema_extra={"default": {}}
    )
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec,
        description="Gang scheduling of the pods (see docs/scheduling.md).",
        json_schema_extra={"default": {}},
    )
    runtime: RuntimeSpec = Field(
        default_factory=RuntimeSpec,
        description="kubetrain's runtime in images that lack it (see docs/images.md).",
        json_schema_extra={"default": {}},
    )
    template: PodTemplate | None = Field(
        None,
        description=(
            "A PodTemplateSpec fragment merged into every pod: labels, annotations, volumes, the trainer "
            "container's mounts/workingDir/securityContext/envFrom, init and sidecar containers, scheduling "
            "and security settings. See docs/pod-template.md for the merge rules."
        ),
    )

    @model_validator(mode="after")
    def _cross_field(self) -> TrainingJobSpec:
        if self.backend == "nccl" and self.gpus_per_node == 0:
            raise ValueError("backend: nccl needs GPUs: set gpusPerNode >= 1 or backend gloo/auto")
        if self.training.bf16 and self.gpus_per_node == 0:
            raise ValueError("training.bf16: bf16 autocast needs GPUs: set gpusPerNode >= 1")
        store = self.checkpoint.object_store
        if store is not None and store.credentials_secret is not None:
            for index, var in enumerate(self.env or []):
                if var.name in OBJECT_STORE_CREDENTIALS:
                    raise ValueError(
                        f"env[{index}].name: {var.name} comes from checkpoint.objectStore.credentialsSecret "
                        f"({store.credentials_secret}): set the credentials in one place"
                    )
        elastic = _elastic_problem(self)
        if elastic is not None:
            raise ValueError(elastic)
        if self.template is not None:
            found = template_problems(self.template, checkpoint_dir=self.checkpoint.dir, master_port=self.master_port)
            if found:
                raise ValueError(found[0])
        return self

    @property
    def procs_per_node(self) -> int:
        return max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def min_nodes(self) -> int:
        """The fewest nodes the gang trains with: elastic.minNodes, or every node without spec.elastic."""
        return self.elastic.min_nodes if self.elastic is not None else self.nodes

    def trainer_config(self) -> TrainConfig:
        return TrainConfig(training=self.training, checkpoint=self.checkpoint.trainer_config(), backend=self.backend)


class ObjectMeta(StrictModel):
    """The parts of metadata kubetrain reads; everything else Kubernetes keeps passes through."""

    model_config = ConfigDict(extra="allow")

    name: str | None = Field(
        None,
        min_length=1,
        max_length=naming.MAX_JOB_NAME,
        pattern=naming.DNS_1035_LABEL,
        description="Job name: a DNS-1035 label short enough for every child name.",
    )
    generate_name: str | None = Field(None, max_length=naming.MAX_JOB_NAME - 5)
    namespace: str | None = Field(None, max_length=63)
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    uid: str | None = None
    generation: int | None = None

    @model_validator(mode="after")
    def _named(self) -> ObjectMeta:
        if self.name is None and self.generate_name is None:
            raise ValueError("name: a TrainingJob needs metadata.name (or generateName)")
        return self


# --- status -----------------------------------------------------------------------------

Phase = Literal["Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]


class Condition(StrictModel):
    """A metav1.Condition: lastTransitionTime changes only when status changes."""

    type: str = Field(max_length=316, pattern=r"^[A-Za-z][A-Za-z0-9]*$", description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", description="Why.")
    message: str = Field("", max_length=32_768, description="Human-readable details.")
    last_transition_time: datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(None, ge=0, description="The spec generation this was computed from.")


class ReplicaCounts(StrictModel):
    active: int = Field(0, ge=0, le=naming.MAX_NODES, description="Pods pending or running.")
    ready: int = Field(0, ge=0, le=naming.MAX_NODES, description="Pods running and ready.")
    succeeded: int = Field(0, ge=0, le=naming.MAX_NODES, description="Pods that exited 0 in this attempt.")
    failed: int = Field(0, ge=0, le=naming.MAX_NODES, description="Pods that failed in this attempt.")


class Progress(StrictModel):
    """Rank 0's latest metrics line."""

    epoch: int | None = Field(None, ge=0, description="Current epoch (0-based).")
    step: int | None = Field(None, ge=0, description="Optimizer steps done.")
    total_steps: int | None = Field(None, ge=0, description="Optimizer steps planned.")
    percent: int | None = Field(None, ge=0, le=100, description="step / totalSteps, in percent.")
    loss: float | None = Field(None, description="Training loss averaged across ranks.")
    accuracy: float | None = Field(None, ge=0, le=1, description="Last evaluation accuracy.")
    samples_per_second: float | None = Field(None, ge=0, description="Global training throughput.")
    updated_at: datetime | None = Field(None, description="When rank 0 reported this.")
    done_at: datetime | None = Field(
        None,
        description=(
            "When rank 0 recorded `done` (its training loop finished). Cleared by a later `start` "
            "record or one at an earlier step (a new run)."
        ),
    )


class LastCheckpoint(StrictModel):
    path: str = Field(max_length=1024, description="Checkpoint directory.")
    step: int = Field(ge=0, description="Optimizer step it holds.")
    time: datetime | None = Field(None, description="When it was completed.")
    reason: str | None = Field(
        None,
        max_length=64,
        description=(
            "Why it was taken: periodic (everySteps/everySeconds), epoch, final, signal (the pod was being "
            "stopped: deleted, evicted, preempted, suspended), or peer_lost (a peer process died and a survivor "
            "saved the step the gang had reached); the next attempt resumes from it."
        ),
    )


class CheckpointRefusal(StrictModel):
    """A checkpoint the object store refused to commit (checkpoint.objectStore): its attempt is
    stale, a newer one holds the store, so its commit could not overwrite the newer one's."""

    attempt: int = Field(ge=0, description="The stale attempt that tried to commit it.")
    current_attempt: int | None = Field(None, ge=0, description="The attempt that holds the object store.")
    step: int = Field(ge=0, description="Optimizer step it holds.")
    path: str = Field(max_length=1024, description="Object URL of the refused checkpoint.")
    time: datetime | None = Field(None, description="When it was refused.")


class CheckpointSkip(StrictModel):
    """A commit of the object store that a resume walked back past (checkpoint.objectStore): its
    payload was missing or did not match the commit, and an older commit was resumed instead."""

    attempt: int | None = Field(None, ge=0, description="The attempt that skipped it on its resume.")
    step: int = Field(ge=0, description="Optimizer step the commit holds.")
    path: str = Field(max_length=1024, description="Object URL of the skipped checkpoint.")
    why: str = Field("", max_length=1024, description="What was wrong with it: missing, or not matching its commit.")
    time: datetime | None = Field(None, description="When it was skipped.")


class RuntimeFallback(StrictModel):
    """A feature of what kubetrain runs beside the training script (torchrun's agent, its hooks)
    that the job's torch lacks a private name or parameter for: torch's own behaviour runs
    instead (kubetrain.runtime.torch_private)."""

    feature: str = Field(
        max_length=64,
        description=(
            "exit-barrier, in-place-restart, kill-at-once, warm-start, fork-cuda-check, nvml-gpu-check, preload, "
            "wait-for-node0, resize-in-place or shutdown-timeout (PET_SHUTDOWN_TIMEOUT, ignored by torch before 2.10)."
        ),
    )
    torch: str = Field("", max_length=64, description="The torch version that lacks it.")
    message: str = Field("", max_length=1024, description="What it lacks, and what runs instead.")
    time: datetime | None = Field(None, description="When a torchrun agent first reported it.")


MAX_FALLBACKS_KEPT = 16


class Failure(StrictModel):
    """One failed attempt: what the gang restart was for."""

    attempt: int = Field(ge=0, description="The attempt that failed.")
    rank: int | None = Field(None, ge=0, description="Node rank of the pod that failed first.")
    pod: str | None = Field(None, max_length=253, description="Pod name.")
    node: str | None = Field(None, max_length=253, description="Kubernetes node it ran on.")
    exit_code: int | None = Field(None, description="Container exit code.")
    reason: str = Field(max_length=256, description="Error, OOMKilled, Evicted, PodDeleted, ImagePullBackOff, ...")
    message: str = Field("", max_length=4096, description="Termination message or log tail.")
    time: datetime | None = Field(None, description="When it was observed.")


MAX_FAILURES_KEPT = 20


class Resize(StrictModel):
    """One change of an elastic gang's size (spec.elastic)."""

    attempt: int = Field(ge=0, description="The attempt that trains at the new size.")
    from_size: int = Field(ge=0, description="Nodes before.")
    to_size: int = Field(ge=0, description="Nodes after.")
    reason: str = Field(max_length=256, description="NodeLost (with the pod's own reason) or CapacityReturned.")
    message: str = Field("", max_length=1024, description="Which nodes left or joined, and why.")
    step: int | None = Field(None, ge=0, description="Rank 0's last reported step when the resize was decided.")
    time: datetime | None = Field(None, description="When it was decided.")


MAX_RESIZES_KEPT = 20


class StandbyFailure(StrictModel):
    """A node whose pod failed while on standby (spec.elastic): it is created again after a back-off."""

    node: int = Field(ge=0, description="The node rank (pod name suffix).")
    pod_uid: str = Field(max_length=128, description="The last failed pod's uid: each pod counts once.")
    count: int = Field(ge=1, description="Failures on standby in a row (reset once the node joins a gang).")
    last_at: datetime = Field(description="When the last one was seen.")
    message: str = Field("", max_length=1024, description="How it failed.")


AttemptStart = Literal["Start", "InPlace", "Recreate", "Resume"]


class Timeline(StrictModel):
    """Where the time of the current attempt went, until its first training step. Each time is set
    once, when that phase ended; a phase the attempt skips stays unset (an in-place restart creates,
    schedules and starts no pod). Times from rank 0's records keep their fraction of a second."""

    attempt: int = Field(ge=0, description="The attempt these times belong to.")
    start: AttemptStart = Field(
        description=(
            "How the attempt began: `Start` (the job's first), `InPlace` (its pods kept, the workers restarted), "
            "`Recreate` (the gang's pods deleted and created again), `Resume` (after a suspension)."
        )
    )
    failed_at: datetime | None = Field(None, description="When the failure that ended the previous attempt happened.")
    detected_at: datetime | None = Field(None, description="When the restart was decided.")
    pods_created_at: datetime | None = Field(None, description="When the last pod of the attempt was created.")
    pods_scheduled_at: datetime | None = Field(None, description="When the last pod of the attempt was bound.")
    containers_started_at: datetime | None = Field(
        None, description="When the last trainer container of the attempt started."
    )
    workers_started_at: datetime | None = Field(
        None, description="When node 0's torchrun agent started its workers (in-place restarts; its `launch` record)."
    )
    rendezvous_at: datetime | None = Field(None, description="When rank 0 joined its process group (`rendezvous`).")
    first_step_at: datetime | None = Field(None, description="When rank 0 finished its first training step.")
    phases: str = Field(
        "",
        max_length=1024,
        description="The phases so far and their seconds, e.g. `detect 0.4s, restart workers 0.2s, ...`.",
    )
    waiting_on: str = Field(
        "",
        max_length=4096,
        description="What the attempt waits on now, e.g. `scheduling: 0/3 nodes are available`; empty once it trains.",
    )


class TrainingJobStatus(StrictModel):
    phase: Phase | None = Field(None, description="Derived from conditions, for printer columns.")
    conditions: list[Condition] | None = Field(
        None,
        max_length=16,
        description="Created, Running, Restarting, Stalled, PodCreationBlocked, Suspended, Succeeded, Failed.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(None, ge=0, description="The spec generation last reconciled.")
    attempt: int = Field(0, ge=0, description="The current gang attempt; pods carry it as a label.")
    restarts: int = Field(0, ge=0, description="Gang restarts so far (counted against runPolicy.maxRestarts).")
    uncounted_restarts: int = Field(
        0,
        ge=0,
        description="Gang restarts not counted against maxRestarts (by default: disruptions such as evictions).",
    )
    replicas: ReplicaCounts | None = Field(None, description="Pod counts of the current attempt.")
    size: int | None = Field(None, ge=0, description="Nodes training in the current attempt (spec.elastic jobs only).")
    members: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        max_length=naming.MAX_NODES,
        description=(
            "Node ranks (pod name suffixes) in the current attempt's gang, in gang order (spec.elastic jobs). "
            "Other pods of the attempt wait for capacity to grow the gang."
        ),
    )
    resizes: list[Resize] | None = Field(
        None, max_length=MAX_RESIZES_KEPT, description=f"The last {MAX_RESIZES_KEPT} resizes of an elastic gang."
    )
    standby_failures: list[StandbyFailure] | None = Field(
        None,
        max_length=naming.MAX_NODES,
        description=(
            "Elastic jobs: nodes whose pod failed on standby. Each is created again after a back-off, "
            "10 s doubling per failure in a row up to 5 min, instead of at once on every pass."
        ),
    )
    start_time: datetime | None = Field(None, description="When the job first started.")
    completion_time: datetime | None = Field(None, description="When the job succeeded or failed.")
    progress: Progress | None = Field(None, description="Rank 0's latest metrics.")
    last_checkpoint: LastCheckpoint | None = Field(None, description="Newest complete checkpoint.")
    last_checkpoint_refusal: CheckpointRefusal | None = Field(
        None,
        description=(
            "The newest checkpoint the object store refused to commit, from a stale attempt; each new one is "
            "also a CheckpointRefused Warning Event."
        ),
    )
    last_checkpoint_skipped: CheckpointSkip | None = Field(
        None,
        description=(
            "The newest commit of the object store a resume skipped (its payload missing or not matching); each "
            "new one is also a CheckpointSkipped Warning Event."
        ),
    )
    failures: list[Failure] | None = Field(
        None, max_length=MAX_FAILURES_KEPT, description=f"The last {MAX_FAILURES_KEPT} failed attempts."
    )
    runtime_fallbacks: list[RuntimeFallback] | None = Field(
        None,
        max_length=MAX_FALLBACKS_KEPT,
        description=(
            "What kubetrain's runtime could not do with this job's torch, each falling back to torch's own "
            "behaviour; each is also a RuntimeFallback Warning Event."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["feature"]},
    )
    timeline: Timeline | None = Field(
        None, description="Where the current attempt's time went until its first step, and what it waits on now."
    )


class TrainingJob(StrictModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.metadata.name.size() <= {naming.MAX_JOB_NAME}",
                    "message": (
                        f"metadata.name must be at most {naming.MAX_JOB_NAME} characters so that every "
                        f"pod name <name>{naming.NODE_INFIX}<rank> stays a valid DNS-1035 label"
                    ),
                },
                {
                    "rule": f"self.metadata.name.matches('{naming.DNS_1035_LABEL}')",
                    "message": (
                        "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', "
                        "starting with a letter): it names the headless Service"
                    ),
                },
            ]
        }
    )

    api_version: Literal["kubetrain.dev/v1alpha1"] = Field(description="kubetrain.dev/v1alpha1")
    kind: Literal["TrainingJob"] = Field(description="TrainingJob")
    metadata: ObjectMeta
    spec: TrainingJobSpec
    status: TrainingJobStatus | None = None

    @property
    def name(self) -> str:
        assert self.metadata.name is not None, "name is set by the API server before reconciling"
        return self.metadata.name
