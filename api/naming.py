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
LABEL_ROLE = f"{LABEL_PREFIX}/role"
LABEL_JOB_UID = f"{LABEL_PREFIX}/job-uid"
ROLE_MASTER = "master"
ROLE_WORKER = "worker"

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubetrain-operator"

CONTAINER_NAME = "trainer"
# The volumes kubetrain renders into every pod: their names and the paths they are mounted
# at are kubetrain's, and spec.template may not reuse them.
CHECKPOINT_VOLUME = "checkpoints"
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"
# The pod's own facts for its torchrun agent (the attempt label, by the downward API): read by
# the in-place restart (trainer/agent.py).
POD_INFO_VOLUME = "kubetrain-pod"
POD_INFO_PATH = "/etc/kubetrain-pod"
ATTEMPT_FILE = "attempt"
AGENT_PORT_NAME = "agent"
MASTER_PORT_NAME = "rendezvous"


def service_name(job: str) -> str:
    return job


def pod_name(job: str, node_rank: int) -> str:
    return f"{job}{NODE_INFIX}{node_rank}"


def node_line(node_rank: int, text: str) -> str:
    """A line of node `node_rank`'s output, as `kubetrain run --local` and `kubetrain logs` show it."""
    return f"[node-{node_rank}] {text}"


def master_host(job: str, namespace: str, cluster_domain: str) -> str:
    """The FQDN of node 0; resolves before the pod is ready (publishNotReadyAddresses)."""
    return f"{pod_name(job, 0)}.{service_name(job)}.{namespace}.svc.{cluster_domain}"


def role(node_rank: int) -> str:
    return ROLE_MASTER if node_rank == 0 else ROLE_WORKER
