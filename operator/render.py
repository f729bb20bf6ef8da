"""Pure rendering: a TrainingJob → its headless Service and one Pod per node.

No client, no clock, no randomness: the same job, uid and attempt always render the same
dicts. The operator creates them; `kubetrain run --local` renders the same pods and runs
their containers as local processes, so the env contract has exactly one implementation
(`kubetrain.api.contract.rendezvous_env`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from kubetrain.api import naming
from kubetrain.api.contract import (
    AGENT_PORT_ENV,
    AGENT_TOKEN_ENV,
    AGENT_TOKEN_KEY,
    ATTEMPT_ENV,
    ATTEMPT_FILE_ENV,
    CHECKPOINT_DIR_ENV,
    DEFAULT_COMMAND,
    DEFAULT_GRACE_SECONDS,
    JOB_UID_ENV,
    MEMBERS_FILE,
    OBJECT_STORE_CREDENTIALS,
    OPTIONAL_CREDENTIALS,
    POD_IP_ENV,
    READY_PATH,
    SHUTDOWN_TIMEOUT_ENV,
    STACKS_AFTER_ENV,
    default_env,
    format_members,
    is_reserved,
    rendezvous_env,
    stacks_after_seconds,
)
from kubetrain.api.models import GPU_RESOURCE, TrainingJob
from kubetrain.api.podtemplate import PodTemplate
from kubetrain.api.training import CONFIG_ENV
from kubetrain.operator.settings import DEFAULTS, RenderSettings

CHECKPOINT_VOLUME = naming.CHECKPOINT_VOLUME
SHM_VOLUME = naming.SHM_VOLUME
SHM_PATH = naming.SHM_PATH
POD_INFO_VOLUME = naming.POD_INFO_VOLUME
MANAGED_BY = naming.MANAGED_BY
# Pod Security "restricted" wants a non-root user; the images (Dockerfile) run as this uid, and
# fsGroup makes a fresh checkpoint volume writable by it.
RUN_AS_USER = 10001
SECCOMP = {"type": "RuntimeDefault"}
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS_USER,
    "runAsGroup": RUN_AS_USER,
    "fsGroup": RUN_AS_USER,
    "seccompProfile": SECCOMP,
}
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": SECCOMP,
}
# Who the processes run as. Setting any of these in spec.template hands the choice to the user.
IDENTITY = ("runAsUser", "runAsGroup", "fsGroup", "runAsNonRoot")


def owner_reference(job: TrainingJob, uid: str) -> dict[str, Any]:
    """Controller reference: children are garbage-collected with the job and watched as its own."""
    return {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "name": job.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def selector_labels(job_name: str) -> dict[str, str]:
    return {naming.LABEL_JOB: job_name}


def pod_labels(job: TrainingJob, uid: str, node_rank: int, attempt: int) -> dict[str, str]:
    return {
        **selector_labels(job.name),
        naming.LABEL_JOB_UID: uid,
        naming.LABEL_NODE_RANK: str(node_rank),
        naming.LABEL_ATTEMPT: str(attempt),
        naming.LABEL_ROLE: naming.role(node_rank),
        naming.LABEL_MANAGED_BY: MANAGED_BY,
    }


def render_service(job: TrainingJob, namespace: str, uid: str) -> dict[str, Any]:
    """Headless, and publishing not-ready addresses: node 0's DNS name must resolve while the
    gang is still starting, or the other nodes cannot reach the rendezvous."""
    name = naming.service_name(job.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                **selector_labels(job.name),
                naming.LABEL_JOB_UID: uid,
                naming.LABEL_MANAGED_BY: MANAGED_BY,
            },
            "ownerReferences": [owner_reference(job, uid)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(job.name),
            "ports": [
                {
                    "name": naming.MASTER_PORT_NAME,
                    "port": job.spec.master_port,
                    "targetPort": job.spec.master_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def render_agent_secret(job: TrainingJob, namespace: str, uid: str, token: str) -> dict[str, Any]:
    """The job's agent token (an in-place job's): the operator signs its orders of the next
    attempt with it, and the pods' torchrun agents take only orders signed so (runtime/agent/inplace.py).
    The caller chooses the token (this module has no randomness)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": naming.agent_secret_name(job.name),
            "namespace": namespace,
            "labels": {**selector_labels(job.name), naming.LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [owner_reference(job, uid)],
        },
        "type": "Opaque",
        "stringData": {AGENT_TOKEN_KEY: token},
    }


def agent_port(job: TrainingJob) -> int:
    """The port the torchrun agent listens on while its workers run: the readiness probe's."""
    port = job.spec.master_port
    return port + 1 if port < 65535 else port - 1


def in_place(job: TrainingJob) -> bool:
    return job.spec.run_policy.restart_strategy == "InPlace"


def _attempt_env(job: TrainingJob, attempt: int) -> list[dict[str, Any]]:
    """The attempt the pod is created for (rank 0's records carry it: the attempt's timeline), and
    what the torchrun agent of an in-place job reads (runtime/agent/inplace.py)."""
    env: list[dict[str, Any]] = [{"name": ATTEMPT_ENV, "value": str(attempt)}]
    if in_place(job):
        env.append({"name": ATTEMPT_FILE_ENV, "value": f"{naming.POD_INFO_PATH}/{naming.ATTEMPT_FILE}"})
        env.append({"name": AGENT_PORT_ENV, "value": str(agent_port(job))})
        # Where the agent listens for the operator's orders, and the token they are signed with.
        # Optional: a pod whose Secret is missing (an operator without the RBAC to create it)
        # still starts, and its agent follows the attempt file alone.
        env.append({"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        secret = {"name": naming.agent_secret_name(job.name), "key": AGENT_TOKEN_KEY, "optional": True}
        env.append({"name": AGENT_TOKEN_ENV, "valueFrom": {"secretKeyRef": secret}})
    return env


def _in_place_pod(job: TrainingJob, container: dict[str, Any], pod_spec: dict[str, Any]) -> None:
    """The in-place restart's parts of the pod: the attempt label as a file, the agent's port and
    the readiness probe on it. The operator moves a living pod to the next attempt by changing
    the label and by ordering it on the agent port; the agent restarts its workers on whichever
    comes first (the kubelet refreshes the file on its own schedule)."""
    if not in_place(job):
        return
    container["ports"].append({"name": naming.AGENT_PORT_NAME, "containerPort": agent_port(job), "protocol": "TCP"})
    container["volumeMounts"].append({"name": POD_INFO_VOLUME, "mountPath": naming.POD_INFO_PATH, "readOnly": True})
    # Ready = the agent runs the workers of the pod's attempt; NotReady = starting, or holding a
    # failed gang for the operator's decision (the operator then reads the agent's record).
    container["readinessProbe"] = {
        "httpGet": {"path": READY_PATH, "port": naming.AGENT_PORT_NAME},
        "periodSeconds": 1,
        "timeoutSeconds": 1,
        "successThreshold": 1,
        "failureThreshold": 1,
    }
    label = f"metadata.labels['{naming.LABEL_ATTEMPT}']"
    items = [{"path": naming.ATTEMPT_FILE, "fieldRef": {"fieldPath": label}}]
    if job.spec.elastic is not None:
        # One volume: the kubelet updates its files together, so the members never lag the attempt.
        members = f"metadata.annotations['{naming.MEMBERS_ANNOTATION}']"
        items.append({"path": MEMBERS_FILE, "fieldRef": {"fieldPath": members}})
    pod_spec["volumes"].append({"name": POD_INFO_VOLUME, "downwardAPI": {"items": items}})


# The runtime's init container: restricted whatever the template says about the trainer's user (it
# runs the operator image, whose user is 10001).
RUNTIME_SECURITY: dict[str, Any] = {
    **CONTAINER_SECURITY,
    "runAsUser": RUN_AS_USER,
    "runAsGroup": RUN_AS_USER,
    "seccompProfile": SECCOMP,
}
# Its resources are the trainer's of these kinds: a pod's request is the larger of any init container's
# and the sum of its containers', so Kueue, quotas and the scheduler see the job's own numbers (a
# ClusterQueue that covers only GPUs admits it as before), and a quota that wants limits gets them
# where the trainer gives them. It copies ~20 files: whatever the trainer may use is plenty.
RUNTIME_RESOURCE_KINDS = ("cpu", "memory", "ephemeral-storage")
RUNTIME_COMMAND = ("python", "-m", "kubetrain.runtime.bundle", naming.RUNTIME_PATH)
PYTHONPATH = "PYTHONPATH"
# A job's own PYTHONPATH from a valueFrom source goes under this name, which the runtime's refers to.
JOB_PYTHONPATH = "KUBETRAIN_JOB_PYTHONPATH"
# The runtime's loader (a sitecustomize), first on the trainer's PYTHONPATH.
RUNTIME_SITE = f"{naming.RUNTIME_PATH}/site"


def injects_runtime(job: TrainingJob, settings: RenderSettings) -> bool:
    return job.spec.runtime.inject and bool(settings.runtime_image)


def _runtime(job: TrainingJob, container: dict[str, Any], pod_spec: dict[str, Any], settings: RenderSettings) -> None:
    """kubetrain's runtime for an image that may lack it (kubetrain.runtime.bundle): an init
    container of the operator image copies it into an emptyDir, and PYTHONPATH starts with its
    loader, which uses the image's own kubetrain where there is one. The job's own PYTHONPATH
    follows it; the image's (its ENV) is replaced, as any container env replaces it (docs/images.md)."""
    if not injects_runtime(job, settings):
        return
    pod_spec["initContainers"] = [
        {
            "name": naming.RUNTIME_CONTAINER,
            "image": settings.runtime_image,
            "imagePullPolicy": "IfNotPresent",
            "command": list(RUNTIME_COMMAND),
            "volumeMounts": [{"name": naming.RUNTIME_VOLUME, "mountPath": naming.RUNTIME_PATH}],
            "resources": _runtime_resources(container),
            "securityContext": copy.deepcopy(RUNTIME_SECURITY),
            # Its traceback, if it fails, becomes the pod's failure message (status.failures).
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
    ]
    pod_spec["volumes"].append({"name": naming.RUNTIME_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}})
    container["volumeMounts"].append(
        {"name": naming.RUNTIME_VOLUME, "mountPath": naming.RUNTIME_PATH, "readOnly": True}
    )
    site = RUNTIME_SITE
    env: list[dict[str, Any]] = container["env"]
    own = next((var for var in env if var["name"] == PYTHONPATH), None)
    if own is None and _template_env_from(job):
        # Kubernetes gives env precedence over envFrom, so ours would replace a PYTHONPATH that
        # envFrom gives: it refers to it instead. The kubelet expands an env value against envFrom's
        # variables and the env before it, its own name included (a name envFrom lacks stays as
        # written: a path that is not there).
        env.append({"name": PYTHONPATH, "value": f"{site}:$({PYTHONPATH})"})
    elif own is None:
        env.append({"name": PYTHONPATH, "value": site})
    elif "value" in own:
        own["value"] = f"{site}:{own['value']}" if own["value"] else site
    else:  # valueFrom: known only in the pod, so referred to by name
        own["name"] = JOB_PYTHONPATH
        env.append({"name": PYTHONPATH, "value": f"{site}:$({JOB_PYTHONPATH})"})


def _template_env_from(job: TrainingJob) -> bool:
    """Whether the template's trainer container takes variables from envFrom sources."""
    spec = job.spec.template.spec if job.spec.template else None
    return spec is not None and any(container.env_from for container in spec.containers or [])


def _runtime_resources(container: dict[str, Any]) -> dict[str, Any]:
    given: dict[str, dict[str, str]] = container.get("resources", {})
    kept = {part: {k: v for k, v in values.items() if k in RUNTIME_RESOURCE_KINDS} for part, values in given.items()}
    return {part: values for part, values in kept.items() if values}


def _credentials_env(job: TrainingJob) -> list[dict[str, Any]]:
    """checkpoint.objectStore.credentialsSecret's keys as the variables obstore reads. By
    reference only: no credential is ever part of the pod, the job, its status or an Event, and
    only the trainer container gets them (not the template's init containers and sidecars)."""
    store = job.spec.checkpoint.object_store
    if store is None or store.credentials_secret is None:
        return []
    env: list[dict[str, Any]] = []
    for name in OBJECT_STORE_CREDENTIALS:
        ref: dict[str, Any] = {"name": store.credentials_secret, "key": name}
        if name in OPTIONAL_CREDENTIALS:
            ref["optional"] = True
        env.append({"name": name, "valueFrom": {"secretKeyRef": ref}})
    return env


def _env(
    job: TrainingJob, namespace: str, uid: str, node_rank: int, settings: RenderSettings, attempt: int = 0
) -> list[dict[str, Any]]:
    spec = job.spec
    contract = rendezvous_env(
        master_addr=naming.master_host(job.name, namespace, settings.cluster_domain),
        master_port=spec.master_port,
        nnodes=spec.nodes,
        node_rank=node_rank,
        nproc_per_node=spec.procs_per_node,
    )
    env: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in contract.items()]
    user_names = {v.name for v in spec.env or []}
    env.extend({"name": name, "value": value} for name, value in default_env(user_names).items())
    if SHUTDOWN_TIMEOUT_ENV not in user_names:
        env.append({"name": SHUTDOWN_TIMEOUT_ENV, "value": str(grace_seconds(job))})
    if spec.run_policy.hang_timeout_seconds is not None:
        env.append({"name": STACKS_AFTER_ENV, "value": str(stacks_after_seconds(spec.run_policy.hang_timeout_seconds))})
    env.append({"name": CONFIG_ENV, "value": spec.trainer_config().to_env_value()})
    env.append({"name": CHECKPOINT_DIR_ENV, "value": spec.checkpoint.dir})
    env.extend(_credentials_env(job))
    if spec.checkpoint.object_store is not None:
        # Whose commits the store takes: with the attempt, it fences a stale attempt's (trainer/objectstore.py).
        env.append({"name": JOB_UID_ENV, "value": uid})
    env.extend(_attempt_env(job, attempt))
    for var in spec.env or []:
        # The models reject these already; a renderer bug must not let one through.
        assert not is_reserved(var.name), f"reserved env name {var.name!r} reached the renderer"
        env.append(var.wire())
    return env


def grace_seconds(job: TrainingJob) -> int:
    """The pods' terminationGracePeriodSeconds: the template's, else kubetrain's default."""
    template = job.spec.template.spec if job.spec.template else None
    given = template.termination_grace_period_seconds if template else None
    return DEFAULT_GRACE_SECONDS if given is None else given


def quantity(value: int | str) -> str:
    """Quantities go out as strings, as the API serves them (clients reject ints there)."""
    return str(value)


def _resources(job: TrainingJob) -> dict[str, Any]:
    spec = job.spec
    requests = {k: quantity(v) for k, v in ((spec.resources.requests or {}) if spec.resources else {}).items()}
    limits = {k: quantity(v) for k, v in ((spec.resources.limits or {}) if spec.resources else {}).items()}
    limits = {**requests, **limits}
    if spec.gpus_per_node:
        # Extended resources cannot be overcommitted: requests must equal limits.
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = quantity(spec.gpus_per_node)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _checkpoint_volume(job: TrainingJob) -> dict[str, Any]:
    volume = job.spec.checkpoint.volume
    if volume is not None and volume.persistent_volume_claim is not None:
        return {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": volume.persistent_volume_claim.wire()}
    empty_dir: dict[str, Any] = {}
    if volume is not None and volume.empty_dir is not None and volume.empty_dir.size_limit is not None:
        empty_dir["sizeLimit"] = quantity(volume.empty_dir.size_limit)
    return {"name": CHECKPOINT_VOLUME, "emptyDir": empty_dir}


def render_pod(
    job: TrainingJob,
    namespace: str,
    uid: str,
    node_rank: int,
    attempt: int,
    settings: RenderSettings = DEFAULTS.render,
    members: Sequence[int] = (),
) -> dict[str, Any]:
    """Node `node_rank`'s pod of `attempt`; `members`: an elastic gang's members in it (the others,
    this pod too, wait on standby)."""
    spec = job.spec
    if not 0 <= node_rank < spec.nodes:
        raise ValueError(f"node_rank {node_rank} outside 0..{spec.nodes - 1}")
    name = naming.pod_name(job.name, node_rank)
    container: dict[str, Any] = {
        "name": naming.CONTAINER_NAME,
        "image": spec.image or settings.default_image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(spec.command) if spec.command else list(DEFAULT_COMMAND),
        "env": _env(job, namespace, uid, node_rank, settings, attempt),
        "ports": [{"name": naming.MASTER_PORT_NAME, "containerPort": spec.master_port, "protocol": "TCP"}],
        "volumeMounts": [
            {"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.dir},
            {"name": SHM_VOLUME, "mountPath": SHM_PATH},
        ],
        # A crash's traceback survives in the pod status (and so in status.failures) even
        # when the trainer wrote no termination message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.args:
        container["args"] = list(spec.args)
    resources = _resources(job)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": naming.service_name(job.name),
        # The gang restarts as a whole; a single restarted process cannot rejoin DDP.
        "restartPolicy": "Never",
        # Service links would add dozens of *_PORT variables next to the contract.
        "enableServiceLinks": False,
        "automountServiceAccountToken": spec.service_account_name is not None,
        # Time to checkpoint the current step after SIGTERM (api/contract.py); a template may set its own.
        "terminationGracePeriodSeconds": grace_seconds(job),
        "containers": [container],
        "volumes": [
            _checkpoint_volume(job),
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": quantity(spec.shm_size)}},
        ],
    }
    _in_place_pod(job, container, pod_spec)
    _runtime(job, container, pod_spec, settings)
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [toleration.wire() for toleration in spec.tolerations]
    if spec.scheduler_name:
        pod_spec["schedulerName"] = spec.scheduler_name
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": pod_labels(job, uid, node_rank, attempt),
            "ownerReferences": [owner_reference(job, uid)],
            # A deleted pod stays until the operator kept its log tail (operator/archive.py).
            "finalizers": [naming.LOG_FINALIZER],
        },
        "spec": pod_spec,
    }
    if spec.elastic is not None and in_place(job):
        pod["metadata"]["annotations"] = {naming.MEMBERS_ANNOTATION: format_members(attempt, members)}
    return merge_template(pod, spec.template or PodTemplate())


# --- spec.template: the merge rules (api/podtemplate.py documents them) -----------------------


def security_contexts(template: PodTemplate) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's and the containers' securityContext: kubetrain's restricted defaults with the
    template's keys on top. A template that says who runs (any of IDENTITY) drops kubetrain's
    uid/gid/fsGroup, and one that allows root (runAsUser 0, runAsNonRoot false) drops
    runAsNonRoot too: the namespace's Pod Security level then decides whether the pod runs."""
    spec = template.spec
    trainer = spec.trainer() if spec else None
    pod_own = (spec.security_context if spec else None) or {}
    container_own = (trainer.security_context if trainer else None) or {}
    # Deep copies: no rendered pod shares a dict with these constants or with the job.
    pod, container = copy.deepcopy(POD_SECURITY), copy.deepcopy(CONTAINER_SECURITY)
    chosen = [context for context in (pod_own, container_own) if any(key in context for key in IDENTITY)]
    for key in IDENTITY[:3] if chosen else ():
        pod.pop(key)
    if any(context.get("runAsUser") == 0 or context.get("runAsNonRoot") is False for context in chosen):
        pod.pop("runAsNonRoot")
        container.pop("runAsNonRoot")
    return {**pod, **copy.deepcopy(pod_own)}, {**container, **copy.deepcopy(container_own)}


def _merge_trainer(container: dict[str, Any], given: dict[str, Any]) -> None:
    """`given`: the template's trainer container (wire form, its securityContext already merged)."""
    container["volumeMounts"] += given.get("volumeMounts", [])
    if "workingDir" in given:
        container["workingDir"] = given["workingDir"]
    if "envFrom" in given:
        # Kubernetes gives env precedence over envFrom: the contract cannot be overridden here.
        container["envFrom"] = given["envFrom"]


# Template pod-spec fields set as given: kubetrain renders none of them.
PASSED_THROUGH = (
    "imagePullSecrets",
    "affinity",
    "topologySpreadConstraints",
    "runtimeClassName",
    "dnsConfig",
    "schedulingGates",
    "terminationGracePeriodSeconds",
)


def merge_template(pod: dict[str, Any], template: PodTemplate) -> dict[str, Any]:
    """`pod` with the template merged in (docs/pod-template.md's merge rules)."""
    meta, pod_spec = pod["metadata"], pod["spec"]
    if template.metadata and template.metadata.labels:
        meta["labels"] = {**template.metadata.labels, **meta["labels"]}
    if template.metadata and template.metadata.annotations:
        meta["annotations"] = {**template.metadata.annotations, **meta.get("annotations", {})}
    pod_security, container_security = security_contexts(template)
    pod_spec["securityContext"] = pod_security
    container = pod_spec["containers"][0]
    container["securityContext"] = container_security
    # The wire form is a fresh copy: the pod never shares a dict with the job.
    given = template.spec.wire() if template.spec else {}
    for trainer in given.get("containers", []):
        _merge_trainer(container, trainer)
    pod_spec.update({field: given[field] for field in PASSED_THROUGH if field in given})
    pod_spec["volumes"] += given.get("volumes", [])
    if "initContainers" in given:
        # The same restricted hardening as the trainer's, under each container's own settings; after
        # the runtime's, so that theirs may use it too.
        pod_spec["initContainers"] = pod_spec.get("initContainers", []) + [
            {**c, "securityContext": {**copy.deepcopy(container_security), **c.get("securityContext", {})}}
            for c in given["initContainers"]
        ]
    if given.get("hostNetwork"):
        pod_spec["hostNetwork"] = True
        # Without it a host-network pod resolves names with the node's resolver, and node 0's
        # name (MASTER_ADDR) only exists in the cluster DNS.
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
        # masterPort becomes a port of the node: declaring it lets the scheduler keep two
        # such pods (of any job) off one node instead of letting the second fail to bind.
        for port in container["ports"]:  # masterPort, and the agent's port of an in-place job
            port["hostPort"] = port["containerPort"]
    return pod


def render_pods(
    job: TrainingJob,
    namespace: str,
    uid: str,
    attempt: int,
    settings: RenderSettings = DEFAULTS.render,
) -> list[dict[str, Any]]:
    return [render_pod(job, namespace, uid, rank, attempt, settings) for rank in range(job.spec.nodes)]
