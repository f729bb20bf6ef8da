"""Rendering is pure: the exact objects a job becomes, checked field by field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubetrain.api import naming
from kubetrain.api.contract import DEFAULT_COMMAND, RESERVED_ENV
from kubetrain.api.models import TrainingJob
from kubetrain.api.training import TrainConfig
from kubetrain.operator.render import render_pod, render_pods, render_service
from kubetrain.operator.settings import RenderSettings

pytestmark = pytest.mark.unit

UID = "0b6c3c2e-1111-2222-3333-444455556666"


def job(**spec: Any) -> TrainingJob:
    return TrainingJob.model_validate(
        {"apiVersion": "kubetrain.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j"}, "spec": spec}
    )


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_service_golden() -> None:
    assert render_service(job(nodes=3, masterPort=23456), "team-a", UID) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "j",
            "namespace": "team-a",
            "labels": {
                "kubetrain.dev/job-name": "j",
                "kubetrain.dev/job-uid": UID,
                "app.kubernetes.io/managed-by": "kubetrain-operator",
            },
            "ownerReferences": [
                {
                    "apiVersion": "kubetrain.dev/v1alpha1",
                    "kind": "TrainingJob",
                    "name": "j",
                    "uid": UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"kubetrain.dev/job-name": "j"},
            "ports": [{"name": "rendezvous", "port": 23456, "targetPort": 23456, "protocol": "TCP"}],
        },
    }


def test_pod_env_contract_exact() -> None:
    j = job(nodes=3, gpusPerNode=0, training={"epochs": 2}, env=[{"name": "FOO", "value": "bar"}])
    pod = render_pod(j, "ns", UID, node_rank=2, attempt=4, settings=RenderSettings(cluster_domain="k.example"))
    master = "j-node-0.j.ns.svc.k.example"
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "MASTER_ADDR", "value": master},
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "NNODES", "value": "3"},
        {"name": "NODE_RANK", "value": "2"},
        {"name": "NPROC_PER_NODE", "value": "1"},
        {"name": "WORLD_SIZE", "value": "3"},
        {"name": "PET_NNODES", "value": "3"},
        {"name": "PET_NODE_RANK", "value": "2"},
        {"name": "PET_NPROC_PER_NODE", "value": "1"},
        {"name": "PET_MASTER_ADDR", "value": master},
        {"name": "PET_MASTER_PORT", "value": "29500"},
        {"name": "RANK", "value": "2"},
        {"name": "LOCAL_RANK", "value": "0"},
        {"name": "LOCAL_WORLD_SIZE", "value": "1"},
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
        # torchrun gives its workers the pod's whole grace period to checkpoint after SIGTERM.
        {"name": "PET_SHUTDOWN_TIMEOUT", "value": "120"},
        {"name": "KUBETRAIN_CONFIG", "value": j.spec.trainer_config().to_env_value()},
        {"name": "KUBETRAIN_CHECKPOINT_DIR", "value": "/checkpoints"},
        # The attempt the pod was created for; with the in-place restart (runPolicy.restartStrategy
        # InPlace, the default) the file its label is projected to and the agent's (readiness) port.
        {"name": "KUBETRAIN_ATTEMPT", "value": "4"},
        {"name": "KUBETRAIN_ATTEMPT_FILE", "value": "/etc/kubetrain-pod/attempt"},
        {"name": "KUBETRAIN_AGENT_PORT", "value": "29501"},
        # Where the agent takes the operator's orders of the next attempt, and the token they
        # are signed with (the job's Secret; optional: without it the agent follows the file).
        {"name": "KUBETRAIN_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {
            "name": "KUBETRAIN_AGENT_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "j-kubetrain-agent", "key": "token", "optional": True}},
        },
        {"name": "FOO", "value": "bar"},
        # kubetrain's runtime loader first (spec.runtime.inject, the default).
        {"name": "PYTHONPATH", "value": "/kubetrain-runtime/site"},
    ]
    # The config round-trips into the trainer's model unchanged.
    config = TrainConfig.model_validate_json(env_of(pod)["KUBETRAIN_CONFIG"])
    assert config.training.epochs == 2


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # GPUs: one process per GPU, torchrun sets RANK per process, so the pod does not.
        ({"nodes": 2, "gpusPerNode": 4}, {"NPROC_PER_NODE": "4", "WORLD_SIZE": "8", "RANK": None}),
        ({"nodes": 1, "gpusPerNode": 0}, {"NPROC_PER_NODE": "1", "WORLD_SIZE": "1", "RANK": "0"}),
        ({"nodes": 4, "masterPort": 40000}, {"MASTER_PORT": "40000", "PET_MASTER_PORT": "40000"}),
    ],
)
def test_env_table(spec: dict[str, Any], expected: dict[str, str | None]) -> None:
    env = env_of(render_pod(job(**spec), "ns", UID, 0, 0))
    for name, value in expected.items():
        assert env.get(name) == value, name


def test_user_env_overrides_a_default_without_a_duplicate() -> None:
    j = job(env=[{"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "3"}])
    names = [e["name"] for e in render_pod(j, "ns", UID, 0, 0)["spec"]["containers"][0]["env"]]
    assert names.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 1
    assert env_of(render_pod(j, "ns", UID, 0, 0))["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


def test_user_env_value_from_passes_through() -> None:
    j = job(env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])
    assert env_of(render_pod(j, "ns", UID, 0, 0))["TOKEN"] == {"secretKeyRef": {"name": "s", "key": "k"}}


def test_object_store_credentials_come_from_the_secret_by_reference_only() -> None:
    store = {"url": "s3://bucket/runs/a", "credentialsSecret": "s3-keys"}
    # The template's sidecar and init containers are not training containers: they get none.
    template = {"spec": {"initContainers": [SIDECAR, {"name": "fetch", "image": "busybox"}]}}
    pod = render_pod(job(checkpoint={"objectStore": store}, template=template), "ns", UID, 0, 0)
    (trainer,) = pod["spec"]["containers"]
    credentials = [e for e in trainer["env"] if e["name"].startswith("AWS_")]
    assert credentials == [
        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": "AWS_ACCESS_KEY_ID"}}},
        {
            "name": "AWS_SECRET_ACCESS_KEY",
            "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": "AWS_SECRET_ACCESS_KEY"}},
        },
        {
            "name": "AWS_SESSION_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": "AWS_SESSION_TOKEN", "optional": True}},
        },
    ]
    assert all("env" not in c for c in pod["spec"]["initContainers"])
    # The trainer's configuration names the store but not the Secret; no volume is needed.
    config = json.loads(env_of(pod)["KUBETRAIN_CONFIG"])
    assert config["checkpoint"]["objectStore"] == {"url": "s3://bucket/runs/a"}
    assert pod["spec"]["volumes"][0] == {"name": "checkpoints", "emptyDir": {}}, "the staging area"
    # Without the Secret: the pods' own credentials (IRSA, workload identity), nothing rendered.
    plain = render_pod(job(checkpoint={"objectStore": {"url": store["url"]}}), "ns", UID, 0, 0)
    assert not any(name.startswith("AWS_") for name in env_of(plain))


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"])
def test_a_job_setting_a_credential_the_secret_gives_is_refused(name: str) -> None:
    store = {"url": "s3://bucket/runs/a", "credentialsSecret": "s3-keys"}
    with pytest.raises(
        ValueError, match=rf"env\[0\]\.name: {name} comes from checkpoint\.objectStore\.credentialsSecret"
    ):
        job(checkpoint={"objectStore": store}, env=[{"name": name, "value": "x"}])


@pytest.mark.parametrize("name", [*sorted(RESERVED_ENV), "KUBETRAIN_ANYTHING"])
def test_reserved_env_never_reaches_a_pod(name: str) -> None:
    with pytest.raises(ValueError, match="reserved"):
        job(env=[{"name": name, "value": "x"}])


def test_reserved_env_asserted_in_renderer_too() -> None:
    bad = job(env=[{"name": "OK", "value": "1"}])
    assert bad.spec.env is not None
    # Bypass the model's validator, as a future bug might.
    object.__setattr__(bad.spec.env[0], "name", "RANK")
    with pytest.raises(AssertionError, match="reserved"):
        render_pod(bad, "ns", UID, 0, 0)


def test_pod_shape() -> None:
    # An int quantity (cpu: 4) is rendered as the string the API serves.
    j = job(nodes=2, gpusPerNode=2, backend="nccl", resources={"requests": {"cpu": 4, "memory": "8Gi"}})
    pod = render_pod(j, "ns", UID, 1, 3)
    meta, spec = pod["metadata"], pod["spec"]
    (container,) = spec["containers"]
    assert meta["name"] == "j-node-1"
    assert meta["labels"] == {
        naming.LABEL_JOB: "j",
        naming.LABEL_JOB_UID: UID,
        naming.LABEL_NODE_RANK: "1",
        naming.LABEL_ATTEMPT: "3",
        naming.LABEL_ROLE: "worker",
        "app.kubernetes.io/managed-by": "kubetrain-operator",
    }
    assert meta["ownerReferences"][0]["controller"] is True
    # A deleted pod waits for the operator to keep its log tail (operator/archive.py).
    assert meta["finalizers"] == ["kubetrain.dev/logs"]
    assert (spec["hostname"], spec["subdomain"], spec["restartPolicy"]) == ("j-node-1", "j", "Never")
    assert spec["automountServiceAccountToken"] is False
    assert container["name"] == "trainer"
    assert container["image"] == RenderSettings().default_image
    assert container["command"] == list(DEFAULT_COMMAND)
    assert "args" not in container
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["resources"] == {
        "requests": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"},
        "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"},
    }
    assert container["volumeMounts"] == [
        {"name": "checkpoints", "mountPath": "/checkpoints"},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "kubetrain-pod", "mountPath": "/etc/kubetrain-pod", "readOnly": True},
        {"name": "kubetrain-runtime", "mountPath": "/kubetrain-runtime", "readOnly": True},
    ]
    assert spec["volumes"] == [
        {"name": "checkpoints", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        {
            "name": "kubetrain-pod",
            "downwardAPI": {
                "items": [{"path": "attempt", "fieldRef": {"fieldPath": "metadata.labels['kubetrain.dev/attempt']"}}]
            },
        },
        {"name": "kubetrain-runtime", "emptyDir": {"sizeLimit": "16Mi"}},
    ]
    (runtime,) = spec["initContainers"]
    assert runtime == {
        "name": "kubetrain-runtime",
        "image": RenderSettings().runtime_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "kubetrain.runtime.bundle", "/kubetrain-runtime"],
        "volumeMounts": [{"name": "kubetrain-runtime", "mountPath": "/kubetrain-runtime"}],
        # The trainer's cpu and memory, not its GPUs: the pod's requests stay the job's own.
        "resources": {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def test_in_place_parts_follow_the_restart_strategy() -> None:
    """InPlace (the default): the agent's port, a readiness probe on it every second, and the
    attempt label as a file; Recreate renders none of them."""
    container = render_pod(job(masterPort=65535), "ns", UID, 0, 2)["spec"]["containers"][0]
    assert container["ports"] == [
        {"name": "rendezvous", "containerPort": 65535, "protocol": "TCP"},
        {"name": "agent", "containerPort": 65534, "protocol": "TCP"},
    ]
    assert container["readinessProbe"] == {
        "httpGet": {"path": "/ready", "port": "agent"},
        "periodSeconds": 1,
        "timeoutSeconds": 1,
        "successThreshold": 1,
        "failureThreshold": 1,
    }
    recreate = render_pod(job(runPolicy={"restartStrategy": "Recreate"}), "ns", UID, 0, 2)
    (plain,) = recreate["spec"]["containers"]
    assert "readinessProbe" not in plain and [p["name"] for p in plain["ports"]] == ["rendezvous"]
    assert not {"KUBETRAIN_ATTEMPT_FILE", "KUBETRAIN_AGENT_PORT"} & set(env_of(recreate))
    assert env_of(recreate)["KUBETRAIN_ATTEMPT"] == "2", "rank 0's records carry the attempt either way"
    assert [v["name"] for v in recreate["spec"]["volumes"]] == ["checkpoints", "dshm", "kubetrain-runtime"]


def test_restricted_pod_security() -> None:
    """The fields Pod Security "restricted" checks, in both places it checks them."""
    pod = render_pod(job(), "ns", UID, 0, 0)
    pod_sc = pod["spec"]["securityContext"]
    container_sc = pod["spec"]["containers"][0]["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container_sc["allowPrivilegeEscalation"] is False
    assert container_sc["capabilities"] == {"drop": ["ALL"]}
    assert not any("hostPath" in volume for volume in pod["spec"]["volumes"])
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod["spec"])


@pytest.mark.parametrize(
    ("spec", "volume"),
    [
        ({}, {"name": "checkpoints", "emptyDir": {}}),
        ({"volume": {"emptyDir": {"sizeLimit": "5Gi"}}}, {"name": "checkpoints", "emptyDir": {"sizeLimit": "5Gi"}}),
        (
            {"dir": "/ckpt", "volume": {"persistentVolumeClaim": {"claimName": "shared"}}},
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "shared"}},
        ),
    ],
)
def test_checkpoint_volume(spec: dict[str, Any], volume: dict[str, Any]) -> None:
    pod = render_pod(job(checkpoint=spec), "ns", UID, 0, 0)
    assert pod["spec"]["volumes"][0] == volume
    assert pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == spec.get("dir", "/checkpoints")


def test_optional_scheduling_fields() -> None:
    j = job(
        command=["python", "x.py"],
        args=["--a", "1"],
        image="me/img:1",
        serviceAccountName="trainer",
        nodeSelector={"pool": "gpu"},
        tolerations=[{"key": "k", "operator": "Exists"}],
        schedulerName="volcano",
        priorityClassName="high",
        shmSize="8Gi",
    )
    pod = render_pod(j, "ns", UID, 0, 0)
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert (container["command"], container["args"]) == (["python", "x.py"], ["--a", "1"])
    assert container["image"] == "me/img:1"
    assert spec["serviceAccountName"] == "trainer" and spec["automountServiceAccountToken"] is True
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert (spec["schedulerName"], spec["priorityClassName"]) == ("volcano", "high")
    assert spec["volumes"][1]["emptyDir"]["sizeLimit"] == "8Gi"


def test_render_pods_ranks_and_roles_and_determinism() -> None:
    j = job(nodes=3)
    pods = render_pods(j, "ns", UID, attempt=1)
    assert [p["metadata"]["name"] for p in pods] == ["j-node-0", "j-node-1", "j-node-2"]
    assert [p["metadata"]["labels"][naming.LABEL_ROLE] for p in pods] == ["master", "worker", "worker"]
    assert json.dumps(pods, sort_keys=True) == json.dumps(render_pods(j, "ns", UID, attempt=1), sort_keys=True)
    with pytest.raises(ValueError):
        render_pod(j, "ns", UID, 3, 0)


# --- spec.template -------------------------------------------------------------------------

SIDECAR = {"name": "log-shipper", "image": "fluent-bit:3", "restartPolicy": "Always"}
BYO_DATA_TEMPLATE: dict[str, Any] = {
    "metadata": {
        "labels": {"team": "vision", naming.LABEL_ROLE: "mine"},
        "annotations": {"sidecar.istio.io/inject": "false"},
    },
    "spec": {
        "containers": [
            {
                "name": "trainer",
                "workingDir": "/data",
                "volumeMounts": [
                    {"name": "data", "mountPath": "/data", "readOnly": True},
                    {"name": "labels", "mountPath": "/etc/labels"},
                ],
                "envFrom": [{"configMapRef": {"name": "hyperparameters"}}],
            }
        ],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}},
            {"name": "labels", "configMap": {"name": "labels"}},
        ],
        "initContainers": [SIDECAR],
        "imagePullSecrets": [{"name": "regcred"}],
        "terminationGracePeriodSeconds": 60,
        "schedulingGates": [{"name": "example.com/quota"}],
    },
}


def test_template_merged_into_the_pod() -> None:
    """Each merge rule of api/podtemplate.py, on the fields it touches."""
    pod = render_pod(job(template=BYO_DATA_TEMPLATE), "ns", UID, 0, 0)
    meta, spec = pod["metadata"], pod["spec"]
    container = spec["containers"][0]
    # Labels added; on a key kubetrain owns, kubetrain's value wins.
    assert meta["labels"]["team"] == "vision" and meta["labels"][naming.LABEL_ROLE] == "master"
    assert meta["annotations"] == {"sidecar.istio.io/inject": "false"}
    # Volumes and mounts after kubetrain's.
    assert [v["name"] for v in spec["volumes"]] == [
        "checkpoints",
        "dshm",
        "kubetrain-pod",
        "kubetrain-runtime",
        "data",
        "labels",
    ]
    assert container["volumeMounts"] == [
        {"name": "checkpoints", "mountPath": "/checkpoints"},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "kubetrain-pod", "mountPath": "/etc/kubetrain-pod", "readOnly": True},
        {"name": "kubetrain-runtime", "mountPath": "/kubetrain-runtime", "readOnly": True},
        {"name": "data", "mountPath": "/data", "readOnly": True},
        {"name": "labels", "mountPath": "/etc/labels"},
    ]
    assert container["workingDir"] == "/data"
    assert container["envFrom"] == [{"configMapRef": {"name": "hyperparameters"}}]
    # The native sidecar gets the trainer's restricted container hardening, after kubetrain's runtime.
    assert spec["initContainers"][0]["name"] == "kubetrain-runtime"
    assert spec["initContainers"][1:] == [
        {
            **SIDECAR,
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }
    ]
    # Set as given.
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["terminationGracePeriodSeconds"] == 60
    assert spec["schedulingGates"] == [{"name": "example.com/quota"}]
    assert "hostNetwork" not in spec and "dnsPolicy" not in spec


def test_template_without_the_trainer_container_keeps_the_rendered_one() -> None:
    plain = render_pod(job(), "ns", UID, 0, 0)
    templated = render_pod(job(template={"spec": {"runtimeClassName": "nvidia"}}), "ns", UID, 0, 0)
    assert templated["spec"].pop("runtimeClassName") == "nvidia"
    assert templated == plain


def test_rendered_pods_share_no_dict_with_the_job() -> None:
    j = job(template=BYO_DATA_TEMPLATE)
    pod = render_pod(j, "ns", UID, 0, 0)
    pod["spec"]["volumes"][-1]["configMap"]["name"] = "changed"
    pod["spec"]["initContainers"][1]["image"] = "changed"
    pod["spec"]["initContainers"][1]["securityContext"]["capabilities"]["drop"].append("changed")
    pod["spec"]["initContainers"][0]["securityContext"]["capabilities"]["drop"].append("changed")
    pod["spec"]["securityContext"]["seccompProfile"]["type"] = "changed"
    again = render_pod(j, "ns", UID, 0, 0)
    assert again["spec"]["volumes"][-1]["configMap"]["name"] == "labels"
    assert again["spec"]["initContainers"][1]["image"] == SIDECAR["image"]
    assert again["spec"]["initContainers"][1]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert again["spec"]["initContainers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert again["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert again["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
HARDENED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "want_pod", "want_container"),
    [
        # Nothing said: restricted, uid 10001 (what our images run as).
        (None, None, RESTRICTED_POD, {**HARDENED, "runAsNonRoot": True}),
        # Extra keys only: merged over the defaults.
        (
            {"supplementalGroups": [5]},
            None,
            {**RESTRICTED_POD, "supplementalGroups": [5]},
            {**HARDENED, "runAsNonRoot": True},
        ),
        # A root image: kubetrain's identity and non-root enforcement step aside.
        ({"runAsUser": 0}, None, {"runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}, HARDENED),
        # The image's own user, whoever it is.
        (
            {"runAsNonRoot": False},
            None,
            {"runAsNonRoot": False, "seccompProfile": {"type": "RuntimeDefault"}},
            HARDENED,
        ),
        # Another non-root uid: still runAsNonRoot, so still restricted.
        (
            {"runAsUser": 2000},
            None,
            {"runAsUser": 2000, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            {**HARDENED, "runAsNonRoot": True},
        ),
        # Said on the container: the same choice; the container's keys win there.
        (
            None,
            {"runAsUser": 0, "capabilities": {"add": ["CHOWN"]}},
            {"seccompProfile": {"type": "RuntimeDefault"}},
            {**HARDENED, "runAsUser": 0, "capabilities": {"add": ["CHOWN"]}},
        ),
    ],
)
def test_security_context_merge(
    pod_sc: dict[str, Any] | None,
    container_sc: dict[str, Any] | None,
    want_pod: dict[str, Any],
    want_container: dict[str, Any],
) -> None:
    spec: dict[str, Any] = {}
    if pod_sc is not None:
        spec["securityContext"] = pod_sc
    if container_sc is not None:
        spec["containers"] = [{"name": "trainer", "securityContext": container_sc}]
    pod = render_pod(job(image="me/root-image:1", template={"spec": spec}), "ns", UID, 0, 0)
    assert pod["spec"]["securityContext"] == want_pod
    assert pod["spec"]["containers"][0]["securityContext"] == want_container


def test_host_network_resolves_the_cluster_and_claims_the_master_port() -> None:
    pod = render_pod(job(masterPort=23456, template={"spec": {"hostNetwork": True}}), "ns", UID, 0, 0)
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    # The agent's port (the readiness probe's, runPolicy.restartStrategy InPlace) is the node's too.
    assert pod["spec"]["containers"][0]["ports"] == [
        {"name": "rendezvous", "containerPort": 23456, "hostPort": 23456, "protocol": "TCP"},
        {"name": "agent", "containerPort": 23457, "hostPort": 23457, "protocol": "TCP"},
    ]


def test_the_runtime_goes_to_every_pod_unless_the_job_or_the_operator_opts_out() -> None:
    """spec.runtime.inject (default true) and the operator's runtime image (empty: none): an init
    container of that image, its volume mounted read-only, and PYTHONPATH starting with the loader."""
    injected = render_pod(job(), "ns", UID, 0, 0, RenderSettings(runtime_image="registry.example/op:2"))
    assert injected["spec"]["initContainers"][0]["image"] == "registry.example/op:2"
    assert injected["spec"]["initContainers"][0]["resources"] == {}, "the trainer requests nothing: nor does it"
    assert env_of(injected)["PYTHONPATH"] == "/kubetrain-runtime/site"
    for off in (
        render_pod(job(runtime={"inject": False}), "ns", UID, 0, 0),
        render_pod(job(), "ns", UID, 0, 0, RenderSettings(runtime_image="")),
    ):
        assert "initContainers" not in off["spec"] and "PYTHONPATH" not in env_of(off)
        assert "kubetrain-runtime" not in [v["name"] for v in off["spec"]["volumes"]]
        assert "kubetrain-runtime" not in [m["name"] for m in off["spec"]["containers"][0]["volumeMounts"]]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (
            {"name": "PYTHONPATH", "value": "/src:/lib"},
            [{"name": "PYTHONPATH", "value": "/kubetrain-runtime/site:/src:/lib"}],
        ),
        ({"name": "PYTHONPATH", "value": ""}, [{"name": "PYTHONPATH", "value": "/kubetrain-runtime/site"}]),
        (
            {"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "paths", "key": "python"}}},
            [
                {
                    "name": "KUBETRAIN_JOB_PYTHONPATH",
                    "valueFrom": {"configMapKeyRef": {"name": "paths", "key": "python"}},
                },
                {"name": "PYTHONPATH", "value": "/kubetrain-runtime/site:$(KUBETRAIN_JOB_PYTHONPATH)"},
            ],
        ),
    ],
)
def test_the_jobs_own_pythonpath_follows_the_runtimes(given: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    env = render_pod(job(env=[given]), "ns", UID, 0, 0)["spec"]["containers"][0]["env"]
    assert [var for var in env if "PYTHONPATH" in var["name"]] == expected


def test_a_pythonpath_from_envfrom_follows_the_runtimes() -> None:
    """env beats envFrom in Kubernetes: the runtime's PYTHONPATH refers to envFrom's, which the
    kubelet expands (an env value's $(NAME) sees envFrom's variables, its own name included)."""
    source = [{"configMapRef": {"name": "paths"}}]
    template = {"spec": {"containers": [{"name": "trainer", "envFrom": source}]}}
    container = render_pod(job(template=template), "ns", UID, 0, 0)["spec"]["containers"][0]
    assert container["envFrom"] == source
    assert env_of_container(container)["PYTHONPATH"] == "/kubetrain-runtime/site:$(PYTHONPATH)"
    # The job's own env PYTHONPATH wins over envFrom's, as Kubernetes has it: no reference then.
    given = render_pod(job(template=template, env=[{"name": "PYTHONPATH", "value": "/src"}]), "ns", UID, 0, 0)
    assert env_of_container(given["spec"]["containers"][0])["PYTHONPATH"] == "/kubetrain-runtime/site:/src"


def env_of_container(container: dict[str, Any]) -> dict[str, str]:
    return {var["name"]: var.get("value", "") for var in container["env"]}
