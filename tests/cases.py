"""Shared TrainingJob test documents: one valid job and the table of invalid ones.

The same table is checked against the pydantic models (tests/test_api.py) and against a real
kube-apiserver with the generated CRD (tests/test_control_plane.py): both must reject every
case, naming the field.
"""

from __future__ import annotations

import copy
from typing import Any

from support.jobs import BASE_JOB


def _with(path: str, value: Any, *, name: str | None = None, base: dict[str, Any] = BASE_JOB) -> dict[str, Any]:
    """BASE_JOB (or `base`) with the value at a dotted path (`spec.training.epochs`) set."""
    job = copy.deepcopy(base)
    *parents, leaf = path.split(".")
    node = job
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    if name is not None:
        job["metadata"]["name"] = name
    return job


_RULE = "spec.runPolicy.failurePolicy.rules[0]"
_STORE = "spec.checkpoint.objectStore"
_STORE_WITH_SECRET = _with(_STORE, {"url": "s3://bucket/p", "credentialsSecret": "s3-keys"})


def _failure_rule(rule: dict[str, Any]) -> dict[str, Any]:
    return _with("spec.runPolicy.failurePolicy", {"rules": [rule]})


# (case id, document, the field path the error message must name)
INVALID_JOBS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown-spec-field", _with("spec.gpus", 2), "spec.gpus"),
    ("unknown-training-field", _with("spec.training.learningrate", 0.1), "spec.training.learningrate"),
    ("nodes-zero", _with("spec.nodes", 0), "spec.nodes"),
    ("nodes-too-many", _with("spec.nodes", 1025), "spec.nodes"),
    ("nodes-not-a-number", _with("spec.nodes", "two"), "spec.nodes"),
    ("gpus-negative", _with("spec.gpusPerNode", -1), "spec.gpusPerNode"),
    ("gpus-too-many", _with("spec.gpusPerNode", 17), "spec.gpusPerNode"),
    ("image-empty", _with("spec.image", ""), "spec.image"),
    ("pull-policy-unknown", _with("spec.imagePullPolicy", "Sometimes"), "spec.imagePullPolicy"),
    ("master-port-privileged", _with("spec.masterPort", 80), "spec.masterPort"),
    ("backend-unknown", _with("spec.backend", "mpi"), "spec.backend"),
    ("nccl-without-gpus", _with("spec.backend", "nccl"), "spec.backend"),
    ("env-reserved-rendezvous", _with("spec.env", [{"name": "MASTER_ADDR", "value": "x"}]), "spec.env"),
    ("env-reserved-world-size", _with("spec.env", [{"name": "WORLD_SIZE", "value": "8"}]), "spec.env"),
    ("env-reserved-prefix", _with("spec.env", [{"name": "KUBETRAIN_CONFIG_X", "value": "x"}]), "spec.env"),
    ("env-name-with-equals", _with("spec.env", [{"name": "A=B", "value": "x"}]), "spec.env[0].name"),
    (
        "env-value-and-source",
        _with("spec.env", [{"name": "TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
        "spec.env[0].valueFrom",
    ),
    ("gpu-in-resources", _with("spec.resources", {"limits": {"nvidia.com/gpu": 1}}), "spec.resources.limits"),
    ("shm-size-not-quantity", _with("spec.shmSize", "lots"), "spec.shmSize"),
    ("toleration-operator-unknown", _with("spec.tolerations", [{"operator": "Maybe"}]), "spec.tolerations[0].operator"),
    ("epochs-zero", _with("spec.training.epochs", 0), "spec.training.epochs"),
    ("batch-size-zero", _with("spec.training.batchSize", 0), "spec.training.batchSize"),
    ("learning-rate-zero", _with("spec.training.learningRate", 0), "spec.training.learningRate"),
    ("grad-accum-zero", _with("spec.training.gradAccumSteps", 0), "spec.training.gradAccumSteps"),
    ("model-unknown", _with("spec.training.model", "resnet"), "spec.training.model"),
    ("bf16-on-cpu", _with("spec.training.bf16", True), "spec.training.bf16"),
    ("checkpoint-keep-zero", _with("spec.checkpoint.keep", 0), "spec.checkpoint.keep"),
    ("checkpoint-every-steps-zero", _with("spec.checkpoint.everySteps", 0), "spec.checkpoint.everySteps"),
    (
        "checkpoint-two-volumes",
        _with("spec.checkpoint.volume", {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "c"}}),
        "spec.checkpoint.volume",
    ),
    ("max-restarts-negative", _with("spec.runPolicy.maxRestarts", -1), "spec.runPolicy.maxRestarts"),
    ("clean-pod-policy-unknown", _with("spec.runPolicy.cleanPodPolicy", "Sometimes"), "spec.runPolicy.cleanPodPolicy"),
    ("deadline-zero", _with("spec.runPolicy.activeDeadlineSeconds", 0), "spec.runPolicy.activeDeadlineSeconds"),
    ("hang-timeout-zero", _with("spec.runPolicy.hangTimeoutSeconds", 0), "spec.runPolicy.hangTimeoutSeconds"),
    (
        "failure-action-unknown",
        _failure_rule({"action": "Ignore", "onExitCodes": {"operator": "In", "values": [2]}}),
        f"{_RULE}.action",
    ),
    ("failure-rule-without-matcher", _failure_rule({"action": "FailJob"}), _RULE),
    (
        "failure-rule-two-matchers",
        _failure_rule(
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}, "onFailureReasons": ["Stalled"]}
        ),
        _RULE,
    ),
    (
        "failure-exit-codes-empty",
        _failure_rule({"action": "FailJob", "onExitCodes": {"operator": "In", "values": []}}),
        f"{_RULE}.onExitCodes.values",
    ),
    (
        "failure-exit-code-out-of-range",
        _failure_rule({"action": "FailJob", "onExitCodes": {"operator": "In", "values": [256]}}),
        f"{_RULE}.onExitCodes.values",
    ),
    (
        "failure-exit-code-zero-with-in",
        _failure_rule({"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0, 2]}}),
        f"{_RULE}.onExitCodes.values",
    ),
    (
        "failure-exit-code-duplicate",
        _failure_rule({"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [1, 1]}}),
        f"{_RULE}.onExitCodes.values",
    ),
    ("object-store-url-not-s3", _with("spec.checkpoint.objectStore", {"url": "gs://bucket/p"}), _STORE + ".url"),
    (
        "object-store-bucket-name-invalid",
        _with("spec.checkpoint.objectStore", {"url": "s3://My_Bucket/p"}),
        _STORE + ".url",
    ),
    (
        "object-store-endpoint-without-scheme",
        _with("spec.checkpoint.objectStore", {"url": "s3://bucket/p", "endpoint": "minio.storage:9000"}),
        _STORE + ".endpoint",
    ),
    (
        "object-store-credentials-secret-not-a-name",
        _with("spec.checkpoint.objectStore", {"url": "s3://bucket/p", "credentialsSecret": "S3 Keys"}),
        _STORE + ".credentialsSecret",
    ),
    (
        "object-store-unknown-field",
        _with("spec.checkpoint.objectStore", {"url": "s3://bucket/p", "secretName": "s3-keys"}),
        _STORE + ".secretName",
    ),
    (
        "object-store-credentials-reserved-by-secret",
        _with("spec.env", [{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}], base=_STORE_WITH_SECRET),
        "spec.env",
    ),
    ("name-too-long", _with("metadata.name", "j" * 54), "metadata.name"),
    ("name-starts-with-digit", _with("metadata.name", "1-job"), "metadata.name"),
]


# --- spec.template (issue 12): Kubernetes' own schemas and kubetrain's rules -----------------


def _template(spec: dict[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": spec or {}}
    if metadata:
        template["metadata"] = metadata
    return _with("spec.template", template)


def _trainer(volumes: list[dict[str, Any]] | None = None, **container: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "trainer", **container}]}
    if volumes is not None:
        spec["volumes"] = volumes
    return _template(spec)


DATA_VOLUME = {"name": "data", "emptyDir": {}}
NODE_AFFINITY = "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
_TERM = {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "Maybe", "values": ["amd64"]}]}

# Case ids containing "rule" are kubetrain's own rules: CEL in the CRD, invisible to a plain
# JSON Schema validator (tests/test_crd.py).
INVALID_JOBS += [
    ("template-unknown-pod-field", _template({"nodeName": "n1"}), "spec.template.spec.nodeName"),
    (
        "template-volume-unknown-field",
        _template({"volumes": [{"name": "data", "configMap": {"nam": "c"}}]}),
        "spec.template.spec.volumes[0].configMap.nam",
    ),
    (
        "template-rule-volume-named-checkpoints",
        _template({"volumes": [{"name": "checkpoints", "emptyDir": {}}]}),
        "spec.template.spec.volumes",
    ),
    (
        "template-rule-volume-named-dshm",
        _template({"volumes": [{"name": "dshm", "emptyDir": {}}]}),
        "spec.template.spec.volumes",
    ),
    (
        "template-rule-mount-at-checkpoint-dir",
        _trainer([DATA_VOLUME], volumeMounts=[{"name": "data", "mountPath": "/checkpoints"}]),
        "spec.template.spec.containers",
    ),
    (
        "template-rule-mount-below-dev-shm",
        _trainer([DATA_VOLUME], volumeMounts=[{"name": "data", "mountPath": "/dev/shm/data"}]),
        "spec.template.spec.containers",
    ),
    (
        "template-rule-mount-of-missing-volume",
        _trainer([DATA_VOLUME], volumeMounts=[{"name": "dataset", "mountPath": "/data"}]),
        "spec.template.spec.containers",
    ),
    (
        "template-mount-without-path",
        _trainer([DATA_VOLUME], volumeMounts=[{"name": "data"}]),
        "spec.template.spec.containers[0].volumeMounts[0].mountPath",
    ),
    (
        "template-second-container",
        _template({"containers": [{"name": "sidecar"}]}),
        "spec.template.spec.containers[0].name",
    ),
    (
        "template-rule-envfrom-kubetrain-prefix",
        _trainer(envFrom=[{"prefix": "KUBETRAIN_", "configMapRef": {"name": "settings"}}]),
        "spec.template.spec.containers[0].envFrom",
    ),
    (
        "template-affinity-operator-unknown",
        _template(
            {
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_TERM]}}
                }
            }
        ),
        f"{NODE_AFFINITY}.nodeSelectorTerms[0].matchExpressions[0].operator",
    ),
    (
        "template-affinity-without-terms",
        _template({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}),
        f"{NODE_AFFINITY}.nodeSelectorTerms",
    ),
    (
        "template-topology-spread-when-unknown",
        _template({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Maybe"}]}),
        "spec.template.spec.topologySpreadConstraints[0].whenUnsatisfiable",
    ),
    (
        "template-rule-init-container-named-trainer",
        _template({"initContainers": [{"name": "trainer", "image": "busybox"}]}),
        "spec.template.spec.initContainers",
    ),
    (
        "template-rule-sidecar-on-master-port",
        _template(
            {
                "initContainers": [
                    {"name": "proxy", "image": "envoy", "restartPolicy": "Always", "ports": [{"containerPort": 29500}]}
                ]
            }
        ),
        "spec.template.spec.initContainers",
    ),
    (
        "template-rule-init-container-restart-never",
        _template({"initContainers": [{"name": "fetch", "image": "busybox", "restartPolicy": "Never"}]}),
        "spec.template.spec.initContainers",
    ),
    (
        "template-empty-dir-size-not-a-quantity",
        _template({"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "lots"}}]}),
        "spec.template.spec.volumes[0].emptyDir.sizeLimit",
    ),
    (
        "template-pull-secret-not-an-object",
        _template({"imagePullSecrets": ["regcred"]}),
        "spec.template.spec.imagePullSecrets[0]",
    ),
    (
        "template-grace-period-negative",
        _template({"terminationGracePeriodSeconds": -1}),
        "spec.template.spec.terminationGracePeriodSeconds",
    ),
    (
        "template-run-as-user-not-a-number",
        _template({"securityContext": {"runAsUser": "root"}}),
        "spec.template.spec.securityContext.runAsUser",
    ),
    (
        "template-scheduling-gate-without-name",
        _template({"schedulingGates": [{}]}),
        "spec.template.spec.schedulingGates[0].name",
    ),
    ("template-label-value-invalid", _template(labels={"team": "ml platform"}), "spec.template.metadata.labels.team"),
    (
        "template-rule-annotation-key-invalid",
        _template(annotations={"not a key": "x"}),
        "spec.template.metadata.annotations",
    ),
    ("template-host-network-not-a-bool", _template({"hostNetwork": "yes"}), "spec.template.spec.hostNetwork"),
]
