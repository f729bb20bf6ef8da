"""`spec.template`: the PodTemplateSpec fragment a TrainingJob merges into the pods it renders.

Users already know the shape (a Deployment's or a Job's `spec.template`); the pod parts are
validated by Kubernetes' own schemas (`k8s_schemas`, generated from the apiserver, inlined
in the CRD and checked here with the same snapshot) plus kubetrain's rules, which exist
twice on purpose like the rest of the API: a pydantic check (clear errors before anything
reaches a cluster) and a CEL rule (the API server's verdict on `kubectl apply`).

Merge rules (operator/render.py applies them; docs/pod-template.md lists them):
- labels and annotations are added to the pod's; on a label key kubetrain owns
  (`OWNED_LABELS`) kubetrain's value wins. kubetrain sets one pod annotation, an elastic job's
  kubetrain.dev/members, whose value wins too.
- `containers` holds at most the trainer container (`name: trainer`), and only the fields
  below; they are merged into the rendered container (lists appended after ours).
  A sidecar is an init container with `restartPolicy: Always` (Kubernetes' native sidecar):
  it stops with the trainer, so the pod still finishes when training does. A plain second
  container would keep every pod Running after training ended.
- `securityContext` (pod and trainer container) is merged key by key over kubetrain's
  restricted defaults; setting `runAsUser` or `runAsNonRoot: false` opts out of kubetrain's
  user (10001) and non-root enforcement, and the namespace's Pod Security level decides.
- every other field is set as given (kubetrain renders none of them).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler, field_validator
from pydantic.config import JsonDict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from kubetrain.api import k8s_schemas, naming
from kubetrain.api.contract import RESERVED_ENV_PREFIX
from kubetrain.api.training import StrictModel

# The CRD generator (crd.py) replaces a node carrying this key with the vendored schema.
VENDORED_MARK = "x-kubetrain-vendored"
OWN_VOLUMES = (naming.CHECKPOINT_VOLUME, naming.SHM_VOLUME, naming.POD_INFO_VOLUME, naming.RUNTIME_VOLUME)
OWN_PATHS = (naming.SHM_PATH, naming.POD_INFO_PATH, naming.RUNTIME_PATH)  # and checkpoint.dir
OWN_INIT_CONTAINERS = (naming.CONTAINER_NAME, naming.RUNTIME_CONTAINER)
OWNED_LABELS = (
    naming.LABEL_JOB,
    naming.LABEL_JOB_UID,
    naming.LABEL_NODE_RANK,
    naming.LABEL_ATTEMPT,
    naming.LABEL_ROLE,
    naming.LABEL_MANAGED_BY,
)
# envFrom prefixes may not start with this: every KUBETRAIN* name is kubetrain's.
OWN_PREFIX = RESERVED_ENV_PREFIX.rstrip("_")
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# A qualified name, as Kubernetes checks label and annotation keys: an optional DNS subdomain
# prefix (253) and '/', then a name (63).
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_QUALIFIED_NAME = re.compile(QUALIFIED_NAME)
LabelKey = Annotated[str, Field(min_length=1, max_length=317)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]


@dataclass(frozen=True)
class Kube:
    """Annotation: the value must fit Kubernetes' schema of `<group>.<field>` (k8s_schemas).

    Checked before pydantic's own (lax) parsing, so that `"30"` is refused where the API
    server refuses it rather than coerced to 30.

    `limits` are kubetrain's own bounds on top (maxItems, maxLength, minimum, maximum), for
    etcd size and CEL cost; the CRD carries them next to the vendored schema."""

    group: str
    field: str
    limits: tuple[tuple[str, int], ...] = ()

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_before_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {VENDORED_MARK: f"{self.group}.{self.field}", **dict(self.limits)}

    def _check(self, value: Any) -> Any:
        k8s_schemas.check(self.group, self.field, value)
        limits = dict(self.limits)
        if "maxItems" in limits and len(value) > limits["maxItems"]:
            raise ValueError(f"at most {limits['maxItems']} items")
        if "maxLength" in limits and len(value) > limits["maxLength"]:
            raise ValueError(f"at most {limits['maxLength']} characters")
        if "minimum" in limits and value < limits["minimum"]:
            raise ValueError(f"must be at least {limits['minimum']}")
        if "maximum" in limits and value > limits["maximum"]:
            raise ValueError(f"must be at most {limits['maximum']}")
        return value


Objects = list[dict[str, Any]]


def _rule(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    out: JsonDict = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


_KEY_RULES: JsonDict = {
    "x-kubernetes-validations": [
        _rule(
            "self.all(k, k.matches('" + QUALIFIED_NAME.replace("\\", "\\\\") + "'))",
            "keys must be qualified names such as example.com/team",
        )
    ]
}


class TemplateMetadata(StrictModel):
    labels: dict[LabelKey, LabelValue] | None = Field(
        None,
        max_length=64,
        description=(
            "Added to every pod's labels. kubetrain's own keys win on conflict: " + ", ".join(OWNED_LABELS) + "."
        ),
        json_schema_extra=_KEY_RULES,
    )
    annotations: dict[LabelKey, Annotated[str, Field(max_length=32_768)]] | None = Field(
        None,
        max_length=64,
        description=(
            'Added to every pod\'s annotations (e.g. `sidecar.istio.io/inject: "false"`); kubetrain sets none '
            "but an elastic job's kubetrain.dev/members."
        ),
        json_schema_extra=_KEY_RULES,
    )

    @field_validator("labels", "annotations")
    @classmethod
    def _qualified_keys(cls, values: dict[str, str] | None) -> dict[str, str] | None:
        for key in values or {}:
            if not _QUALIFIED_NAME.match(key):
                raise ValueError(f"{key!r} is not a qualified name such as example.com/team")
        return values


class TrainerContainer(StrictModel):
    """What may be merged into the rendered trainer container; the rest is the TrainingJob's."""

    name: Literal["trainer"] = Field(description="Must be `trainer`: the container kubetrain renders.")
    volume_mounts: Annotated[Objects, Kube("container", "volumeMounts", (("maxItems", 32),))] | None = Field(
        None, description="Mounts of spec.template.spec.volumes, after kubetrain's (checkpoint.dir, /dev/shm)."
    )
    working_dir: Annotated[str, Kube("container", "workingDir", (("maxLength", 4096),))] | None = Field(
        None, description="Working directory of the command (default: the image's)."
    )
    security_context: Annotated[dict[str, Any], Kube("container", "securityContext")] | None = Field(
        None, description="Merged key by key over kubetrain's restricted container securityContext."
    )
    env_from: Annotated[Objects, Kube("container", "envFrom", (("maxItems", 16),))] | None = Field(
        None,
        description=(
            f"ConfigMaps/Secrets as environment. Prefixes may not start with {OWN_PREFIX}; "
            "kubetrain's variables win over same-named keys (Kubernetes gives env precedence over envFrom)."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    f"self.all(e, !has(e.prefix) || !e.prefix.startsWith('{OWN_PREFIX}'))",
                    f"envFrom prefixes may not start with {OWN_PREFIX}: kubetrain owns those names",
                )
            ]
        },
    )

    @field_validator("name", mode="before")
    @classmethod
    def _only_the_trainer(cls, name: Any) -> Any:
        if name != naming.CONTAINER_NAME:
            raise ValueError(
                f"{name!r}: only the {naming.CONTAINER_NAME} container can be merged; "
                "a sidecar is an init container with restartPolicy: Always"
            )
        return name

    @field_validator("env_from")
    @classmethod
    def _prefix_not_ours(cls, env_from: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, source in enumerate(env_from or []):
            if str(source.get("prefix", "")).startswith(OWN_PREFIX):
                raise ValueError(f"[{index}].prefix: may not start with {OWN_PREFIX}: kubetrain owns those names")
        return env_from


class TemplatePodSpec(StrictModel):
    """Pod spec parts merged into every node's pod; see the module docstring for the rules."""

    containers: list[TrainerContainer] | None = Field(
        None, max_length=1, description="At most the trainer container (`name: trainer`), merged into the rendered one."
    )
    init_containers: Annotated[Objects, Kube("podSpec", "initContainers", (("maxItems", 16),))] | None = Field(
        None,
        description=(
            "Run before the trainer; with `restartPolicy: Always` a native sidecar that stops with the trainer."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "self.all(c, !(c.name in " + repr(list(OWN_INIT_CONTAINERS)) + "))",
                    "the names " + " and ".join(OWN_INIT_CONTAINERS) + " are kubetrain's containers",
                ),
                _rule("self.all(c, has(c.image))", "every init container needs an image"),
                _rule(
                    "self.all(c, !has(c.restartPolicy) || c.restartPolicy == 'Always')",
                    "an init container's restartPolicy may only be Always (a native sidecar)",
                ),
            ]
        },
    )
    volumes: Annotated[Objects, Kube("podSpec", "volumes", (("maxItems", 64),))] | None = Field(
        None,
        description="Volumes for the mounts of the trainer and init containers. "
        + ", ".join(OWN_VOLUMES)
        + " are kubetrain's names.",
        json_schema_extra={
            "x-kubernetes-validations": [
                _rule(
                    "self.all(v, !(v.name in " + repr(list(OWN_VOLUMES)) + "))",
                    "the volume names "
                    + ", ".join(OWN_VOLUMES)
                    + " are kubetrain's (checkpoint.dir, "
                    + ", ".join(OWN_PATHS)
                    + ")",
                )
            ]
        },
    )
    image_pull_secrets: Annotated[Objects, Kube("podSpec", "imagePullSecrets", (("maxItems", 16),))] | None = Field(
        None, description="Secrets for pulling a private image."
    )
    affinity: Annotated[dict[str, Any], Kube("podSpec", "affinity")] | None = Field(
        None, description="Node and pod (anti-)affinity."
    )
    topology_spread_constraints: (
        Annotated[Objects, Kube("podSpec", "topologySpreadConstraints", (("maxItems", 16),))] | None
    ) = Field(None, description="How the gang's pods spread across zones or nodes.")
    runtime_class_name: Annotated[str, Kube("podSpec", "runtimeClassName", (("maxLength", 253),))] | None = Field(
        None, description="RuntimeClass of the pods (e.g. `nvidia`)."
    )
    security_context: Annotated[dict[str, Any], Kube("podSpec", "securityContext")] | None = Field(
        None,
        description=(
            "Merged key by key over kubetrain's (runAsUser/runAsGroup/fsGroup 10001, runAsNonRoot). Setting "
            "runAsUser or runAsNonRoot: false lets the image's user run; the namespace's Pod Security level decides."
        ),
    )
    host_network: Annotated[bool, Kube("podSpec", "hostNetwork")] | None = Field(
        None,
        description=(
            "Use the node's network (dnsPolicy becomes ClusterFirstWithHostNet). masterPort is then a host port: "
            "no two such pods share a node."
        ),
    )
    dns_config: Annotated[dict[str, Any], Kube("podSpec", "dnsConfig")] | None = Field(
        None, description="Extra DNS settings."
    )
    scheduling_gates: Annotated[Objects, Kube("podSpec", "schedulingGates", (("maxItems", 16),))] | None = Field(
        None, description="Hold the pods Pending until the gates are removed."
    )
    termination_grace_period_seconds: (
        Annotated[int, Kube("podSpec", "terminationGracePeriodSeconds", (("minimum", 0), ("maximum", 31_536_000)))]
        | None
    ) = Field(None, description="Seconds between SIGTERM and SIGKILL when a pod is deleted (default 30).")

    @field_validator("init_containers")
    @classmethod
    def _init_containers(cls, containers: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, container in enumerate(containers or []):
            if container.get("name") in OWN_INIT_CONTAINERS:
                raise ValueError(
                    f"[{index}].name: the names {' and '.join(OWN_INIT_CONTAINERS)} are kubetrain's containers"
                )
            if "image" not in container:
                raise ValueError(f"[{index}].image: every init container needs an image")
            if container.get("restartPolicy", "Always") != "Always":
                raise ValueError(f"[{index}].restartPolicy: may only be Always (a native sidecar)")
        return containers

    @field_validator("volumes")
    @classmethod
    def _volumes_not_ours(cls, volumes: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, volume in enumerate(volumes or []):
            if volume.get("name") in OWN_VOLUMES:
                raise ValueError(
                    f"[{index}].name: the volume names {', '.join(OWN_VOLUMES)} are kubetrain's "
                    f"(checkpoint.dir, {', '.join(OWN_PATHS)})"
                )
        return volumes

    def trainer(self) -> TrainerContainer | None:
        return self.containers[0] if self.containers else None


class PodTemplate(StrictModel):
    """A PodTemplateSpec fragment merged into every pod kubetrain renders."""

    metadata: TemplateMetadata | None = Field(None, description="Pod labels and annotations.")
    spec: TemplatePodSpec | None = Field(None, description="Pod spec parts.")


# --- rules that need the rest of the TrainingJob spec ---------------------------------------

_MOUNTS = "self.template.spec.containers[0].volumeMounts"
_HAS_MOUNTS = "has(self.template) && has(self.template.spec) && has(self.template.spec.containers) && "
_HAS_INIT = "has(self.template) && has(self.template.spec) && has(self.template.spec.initContainers) && "


def _collides(path: str, owned: str) -> bool:
    path, owned = path.rstrip("/") or "/", owned.rstrip("/") or "/"
    return path == owned or path.startswith(owned + "/") or owned.startswith(path.rstrip("/") + "/")


SPEC_RULES: list[JsonDict] = [
    _rule(
        "!(" + _HAS_MOUNTS + f"self.template.spec.containers.size() > 0 && has({_MOUNTS}) && {_MOUNTS}.exists(m, "
        "[self.checkpoint.dir, " + ", ".join(f"'{p}'" for p in OWN_PATHS) + "].exists(p, m.mountPath == p || "
        "m.mountPath.startsWith(p + '/') || p.startsWith(m.mountPath + '/') || m.mountPath == '/')))",
        f"a volumeMount may not be at, above or below checkpoint.dir, {', '.join(OWN_PATHS)}: kubetrain mounts those",
        ".template.spec.containers",
    ),
    _rule(
        "!(" + _HAS_MOUNTS + f"self.template.spec.containers.size() > 0 && has({_MOUNTS}) && {_MOUNTS}.exists(m, "
        "!(has(self.template.spec.volumes) && self.template.spec.volumes.exists(v, v.name == m.name))))",
        "every volumeMount must name a volume of spec.template.spec.volumes",
        ".template.spec.containers",
    ),
    _rule(
        "!(" + _HAS_INIT + "self.template.spec.initContainers.exists(c, has(c.ports) && "
        "c.ports.exists(p, p.containerPort == self.masterPort)))",
        "an init container may not use masterPort: the pod's containers share one network namespace",
        ".template.spec.initContainers",
    ),
]


def _mount_problems(template: PodTemplate, checkpoint_dir: str) -> Iterator[str]:
    spec = template.spec
    trainer = spec.trainer() if spec else None
    names = {volume.get("name") for volume in (spec.volumes or [])} if spec else set()
    for index, mount in enumerate((trainer.volume_mounts or []) if trainer else []):
        where = f"template.spec.containers[0].volumeMounts[{index}]"
        for owned in (checkpoint_dir, *OWN_PATHS):
            if _collides(str(mount.get("mountPath", "")), owned):
                yield f"{where}.mountPath: {mount.get('mountPath')!r} collides with {owned}, which kubetrain mounts"
        if mount.get("name") not in names:
            yield f"{where}.name: {mount.get('name')!r} is not a volume of spec.template.spec.volumes"


def problems(template: PodTemplate, *, checkpoint_dir: str, master_port: int) -> list[str]:
    """kubetrain's rules across the template and the rest of the spec (the CEL twins: SPEC_RULES).
    Each message starts with the field it blames, relative to spec."""
    found = list(_mount_problems(template, checkpoint_dir))
    for index, container in enumerate((template.spec.init_containers or []) if template.spec else []):
        for port in container.get("ports", []):
            if port.get("containerPort") == master_port:
                found.append(
                    f"template.spec.initContainers[{index}].ports: {master_port} is masterPort; "
                    "the pod's containers share one network namespace"
                )
    return found
