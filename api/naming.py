"""Names and labels of a TrainingJob's children: the one place their limits are computed."""

from __future__ import annotations

GROUP = "kubetrain.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingJob"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
SHORT_NAMES = ["tj"]
CRD_NAME = f"{PLURAL}.{GROUP}"

MAX_NODES = 1024
# Pods are `<job>-node-<rank>`; the rank has at most len(str(MAX_NODES - 1)) digits. The pod
# name doubles as its hostname, a DNS-1035 label of at most 63 characters, and the job name
# is the headless Service's name, which must be a DNS-1035 label too.
NODE_INFIX = "-node-"
MAX_DNS_LABEL = 63
MAX_JOB_NAME = MAX_DNS_LABEL - len(NODE_INFIX) - len(str(MAX_NODES - 1))
DNS_1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

LABEL_PREFIX = GROUP
LABEL_JOB = f"{LABEL_PREFIX}/job-name"
LABEL_NODE_RANK = f"{LABEL_PREFIX}/node-rank"
LABEL_ATTEMPT = f"{LABEL_PREFIX}/attempt"
# An elastic gang's members of the pod's attempt (api/contract.format_members), projected beside
# the attempt file for the torchrun agent (runtime/agent/inplace.py).
MEMBERS_ANNOTATION = f"{LABEL_PREFIX}/members"
LABEL_ROLE = f"{LABEL_PREFIX}/role"
LABEL_JOB_UID = f"{LABEL_PREFIX}/job-uid"
ROLE_MASTER = "master"
ROLE_WORKER = "worker"

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubetrain-operator"
# What a child is for, where its kind does not say it (the log archive's ConfigMaps).
LABEL_COMPONENT = f"{LABEL_PREFIX}/component"
COMPONENT_LOGS = "logs"

CONTAINER_NAME = "trainer"
# The volumes kubetrain renders into every pod: their names and the paths they are mounted
# at are kubetrain's, and spec.template may not reuse them.
CHECKPOINT_VOLUME = "checkpoints"
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"
# The pod's own facts for its torchrun agent (the attempt label, by the downward API): read by
# the in-place restart (runtime/agent/inplace.py).
POD_INFO_VOLUME = "kubetrain-pod"
POD_INFO_PATH = "/etc/kubetrain-pod"
ATTEMPT_FILE = "attempt"
# kubetrain's runtime for images that lack it (kubetrain.runtime.bundle): an init container
# of this name copies it into this volume, mounted read-only in the trainer at this path.
RUNTIME_VOLUME = "kubetrain-runtime"
RUNTIME_CONTAINER = "kubetrain-runtime"
RUNTIME_PATH = "/kubetrain-runtime"
AGENT_PORT_NAME = "agent"
MASTER_PORT_NAME = "rendezvous"

# Pods carry this finalizer so that a pod being deleted (gang restart, cleanPodPolicy, a user)
# waits until the operator has archived its log tail (operator/archive.py, docs/logs.md).
LOG_FINALIZER = f"{GROUP}/logs"
# One ConfigMap per attempt holds the archived tails, one key per node. ConfigMap names are
# DNS-1123 subdomains (253 characters): a job name (<= MAX_JOB_NAME) plus the suffix always fits.
LOG_ARCHIVE_INFIX = "-attempt-"
LOG_ARCHIVE_SUFFIX = "-logs"
MAX_DNS_SUBDOMAIN = 253


def service_name(job: str) -> str:
    return job


def agent_secret_name(job: str) -> str:
    """The Secret holding an in-place job's agent token (operator/render.py render_agent_secret)."""
    return f"{job}-kubetrain-agent"


def pod_name(job: str, node_rank: int) -> str:
    return f"{job}{NODE_INFIX}{node_rank}"


def node_line(node_rank: int, text: str) -> str:
    """A line of node `node_rank`'s output, as `kubetrain run --local` and `kubetrain logs` show it."""
    return f"[node-{node_rank}] {text}"


def attempt_line(attempt: int, node_rank: int, text: str) -> str:
    """A line of node `node_rank`'s output in `attempt`, as `kubetrain logs -f` shows it while it
    follows a job across its gang restarts."""
    return f"[attempt {attempt} node-{node_rank}] {text}"


def log_archive_name(job: str, attempt: int) -> str:
    """The ConfigMap that keeps the log tails of `attempt`'s pods once they are gone."""
    if attempt < 0:
        raise ValueError(f"attempt {attempt} is negative")
    name = f"{job}{LOG_ARCHIVE_INFIX}{attempt}{LOG_ARCHIVE_SUFFIX}"
    if len(name) > MAX_DNS_SUBDOMAIN:
        raise ValueError(f"log archive name {name[:40]}... is longer than {MAX_DNS_SUBDOMAIN} characters")
    return name


def log_archive_key(node_rank: int) -> str:
    """The ConfigMap key of node `node_rank`'s log tail (and its file name in a local run's
    `attempts/<N>/` directory)."""
    return f"node-{node_rank}.log"


def log_archive_rank(key: str) -> int | None:
    """The node rank of a log archive key (None: not one)."""
    digits = key.removeprefix("node-").removesuffix(".log")
    return int(digits) if digits.isdigit() and key == log_archive_key(int(digits)) else None


def log_archive_selector(job: str, job_uid: str) -> str:
    """The log archives of this job object (a re-created job of the same name has another uid)."""
    return f"{LABEL_JOB}={job},{LABEL_JOB_UID}={job_uid},{LABEL_COMPONENT}={COMPONENT_LOGS}"


def master_host(job: str, namespace: str, cluster_domain: str) -> str:
    """The FQDN of node 0; resolves before the pod is ready (publishNotReadyAddresses)."""
    return f"{pod_name(job, 0)}.{service_name(job)}.{namespace}.svc.{cluster_domain}"


def role(node_rank: int) -> str:
    return ROLE_MASTER if node_rank == 0 else ROLE_WORKER
