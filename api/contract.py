"""The env contract between a TrainingJob's pods and the processes in them.

One implementation, used by the operator's renderer (and so by `kubetrain run --local`)
and read back by the trainer. torchrun reads the `PET_*` mirror, so a bare `torchrun
script.py` in a pod needs no flags; it then sets RANK, LOCAL_RANK and LOCAL_WORLD_SIZE per
process. A single-process pod also carries RANK and LOCAL_RANK so that a plain
`python script.py` with `init_process_group("env://")` works without torchrun.

Standard library only, and on the oldest Python a user's image may carry (3.10): the runtime that
runs beside user code (kubetrain.runtime.bundle) reads these names in any image.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import socket
from collections.abc import Collection, Sequence

# The built-in trainer's whole configuration, one JSON document (kubetrain.api.training).
CONFIG_ENV = "KUBETRAIN_CONFIG"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
NNODES = "NNODES"
NODE_RANK = "NODE_RANK"
NPROC_PER_NODE = "NPROC_PER_NODE"
WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
PET_PREFIX = "PET_"
# checkpoint.dir, for scripts of your own: where their checkpoints survive a restart (the
# checkpoint volume on a cluster, <run-dir>/checkpoints with --local). Reserved by the prefix.
CHECKPOINT_DIR_ENV = "KUBETRAIN_CHECKPOINT_DIR"
TORCHRUN_MIRRORED = (NNODES, NODE_RANK, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT)

# Names a user's `env` may not set: a mismatch here is the classic "RANK means the node"
# confusion, or a job that silently trains with another configuration.
RESERVED_ENV = frozenset(
    (
        MASTER_ADDR,
        MASTER_PORT,
        NNODES,
        NODE_RANK,
        NPROC_PER_NODE,
        WORLD_SIZE,
        RANK,
        LOCAL_RANK,
        LOCAL_WORLD_SIZE,
        *(PET_PREFIX + name for name in TORCHRUN_MIRRORED),
        CONFIG_ENV,
    )
)
RESERVED_ENV_PREFIX = "KUBETRAIN_"
# The fault-injection drill (trainer/faults.py) and the sample ledger (trainer/ledger.py), test
# modes: the KUBETRAIN_* names a job's env may set.
FAULT_ENV = "KUBETRAIN_FAULT"
LEDGER_ENV = "KUBETRAIN_SAMPLE_LEDGER"
USER_SETTABLE = (FAULT_ENV, LEDGER_ENV)
# The in-place gang restart (runtime/agent/inplace.py, runPolicy.restartStrategy InPlace). The pod's
# attempt as rendered; the file that holds its current attempt (the pod's attempt label, projected
# by the downward API: the operator moves a living pod to the next attempt by relabelling it);
# the port the torchrun agent listens on while its workers run (the pod's readiness probe). The
# agent gives its workers the attempt they run as ATTEMPT_ENV.
ATTEMPT_ENV = "KUBETRAIN_ATTEMPT"
# Who writes a checkpoint store's commits (trainer/objectstore.py): the TrainingJob's UID, a local
# run's id. With the attempt it fences the commits of a stale attempt.
JOB_UID_ENV = "KUBETRAIN_JOB_UID"
ATTEMPT_FILE_ENV = "KUBETRAIN_ATTEMPT_FILE"
AGENT_PORT_ENV = "KUBETRAIN_AGENT_PORT"
# The operator also orders the next attempt directly, over the pod network, to the agent port
# (POST /attempt): the pod's IP (the agent listens on it) and the job's agent token (a Secret
# the operator creates; an order is signed with it, so only the operator moves a gang). The
# agent removes the token from its environment before any worker starts.
POD_IP_ENV = "KUBETRAIN_POD_IP"
AGENT_TOKEN_ENV = "KUBETRAIN_AGENT_TOKEN"
AGENT_TOKEN_KEY = "token"
ORDER_PATH = "/attempt"
READY_PATH = "/ready"


def order_signature(token: str, attempt: int, members: Sequence[int] | None = None) -> str:
    """What an order of `attempt` carries: HMAC-SHA256 of it (and of its members, for an elastic
    gang) under the job's agent token."""
    order = str(attempt) if members is None else format_members(attempt, members)
    text = f"kubetrain-attempt:{order}"
    return hmac.new(token.encode(), text.encode(), hashlib.sha256).hexdigest()


# An elastic gang's members (spec.elastic): the node ranks that train in an attempt, in gang order.
# The pods carry them in an annotation that the downward API projects beside the attempt file,
# and the operator's orders carry them too; `kubetrain run --local` writes the file itself.
MEMBERS_FILE = "members"


def format_members(attempt: int, members: Sequence[int]) -> str:
    """`<attempt>:<rank>,<rank>`: the members, with the attempt they are for."""
    return f"{attempt}:{','.join(str(int(rank)) for rank in members)}"


def parse_members(text: str) -> tuple[int, list[int]] | None:
    """(attempt, members) from format_members' text; None for anything else (an empty file: a
    gang of a fixed size)."""
    attempt, sep, ranks = text.strip().partition(":")
    if not sep or not attempt.isdigit():
        return None
    parts = [part for part in ranks.split(",") if part]
    if not all(part.isdigit() for part in parts):
        return None
    return int(attempt), [int(part) for part in parts]


def is_reserved(name: str) -> bool:
    return name in RESERVED_ENV or (name.startswith(RESERVED_ENV_PREFIX) and name not in USER_SETTABLE)


def rendezvous_env(
    *, master_addr: str, master_port: int, nnodes: int, node_rank: int, nproc_per_node: int
) -> dict[str, str]:
    """The rendezvous variables of node `node_rank`, in a stable order."""
    env = {
        MASTER_ADDR: master_addr,
        MASTER_PORT: str(master_port),
        NNODES: str(nnodes),
        NODE_RANK: str(node_rank),
        NPROC_PER_NODE: str(nproc_per_node),
        WORLD_SIZE: str(nnodes * nproc_per_node),
    }
    env.update({PET_PREFIX + name: env[name] for name in TORCHRUN_MIRRORED})
    if nproc_per_node == 1:
        env[RANK] = str(node_rank)
        env[LOCAL_RANK] = "0"
        env[LOCAL_WORLD_SIZE] = "1"
    return env


# checkpoint.objectStore.credentialsSecret: the Secret's keys, each given to the training
# containers as the variable of the same name, the names obstore and every AWS SDK read. A
# session token goes only with temporary keys, so that key may be missing.
AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
AWS_SESSION_TOKEN = "AWS_SESSION_TOKEN"
OBJECT_STORE_CREDENTIALS = (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN)
OPTIONAL_CREDENTIALS = frozenset((AWS_SESSION_TOKEN,))


TORCH_NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"

# Every node's env gets these unless the job's `env` sets the name (they are not reserved:
# a user may choose another value). They hold for a bring-your-own script as much as for the
# built-in trainer, which is why they are rendered rather than set inside the trainer.
DEFAULT_ENV: dict[str, str] = {
    # A failed or stalled NCCL collective aborts the communicator and ends the process, so the
    # gang restarts, instead of every other rank waiting out the process-group timeout
    # (training.processGroupTimeoutSeconds for the built-in trainer; torch's default otherwise).
    TORCH_NCCL_ASYNC_ERROR_HANDLING: "1",
}


# Pods get this terminationGracePeriodSeconds unless spec.template sets one: the time between
# SIGTERM and SIGKILL in which every rank stops at the next optimizer step and rank 0 writes a
# checkpoint of it (kubetrain.runtime.worker.stopping). It covers one or two steps plus a save: the
# README's example saves in ~0.05 s, a 100M-parameter model with AdamW state in seconds on CPU
# (benchmarks/stop_on_signal.py measures both). Kubernetes' own default is 30 s.
DEFAULT_GRACE_SECONDS = 120
# torchrun (2.10+) waits this long for its workers after it is stopped before it SIGKILLs them
# (its default: 30 s); rendered as the pod's grace period so the save may use all of it.
SHUTDOWN_TIMEOUT_ENV = "PET_SHUTDOWN_TIMEOUT"


# With runPolicy.hangTimeoutSeconds: a rank that has not finished an optimizer step for this long
# (half the timeout) writes every thread's Python stack to its log (kubetrain.runtime.worker.watchdog),
# where the operator finds them when it declares the stall and names the rank that hung.
STACKS_AFTER_ENV = "KUBETRAIN_STACKS_AFTER_SECONDS"


def stacks_after_seconds(hang_timeout_seconds: int) -> int:
    return max(1, hang_timeout_seconds // 2)


# runPolicy.startupTimeoutSeconds when only hangTimeoutSeconds is set: start-up (interpreter,
# torch, rendezvous, data, model, a checkpoint to load) is not bounded by the step time a user
# picks hangTimeoutSeconds from; on a loaded 2-core machine it took 8-63 s for the README's
# example (docs/benchmarks-24.md). 600 s is torch's default process-group timeout.
DEFAULT_STARTUP_TIMEOUT_SECONDS = 600


def startup_timeout_seconds(hang_timeout_seconds: int | None, startup_timeout_seconds: int | None) -> int | None:
    """How long an attempt may run before rank 0's first record, or None (not bounded)."""
    if startup_timeout_seconds is not None:
        return startup_timeout_seconds
    if hang_timeout_seconds is None:
        return None
    return max(hang_timeout_seconds, DEFAULT_STARTUP_TIMEOUT_SECONDS)


def default_env(user_names: Collection[str]) -> dict[str, str]:
    """The DEFAULT_ENV entries the job's own `env` (names `user_names`) does not set."""
    return {name: value for name, value in DEFAULT_ENV.items() if name not in user_names}


# The pod command when a TrainingJob sets none: torchrun (configured entirely by the PET_*
# mirror) running the built-in trainer, one process per GPU (or one on CPU).
DEFAULT_COMMAND = ("torchrun", "-m", "kubetrain.trainer", "train")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now, for a rendezvous on one machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


# A failure that no restart can cure (a checkpoint store that refuses the credentials, a bucket that
# does not exist, a checkpoint of another configuration, a store another job took over): the
# trainer raises it with this mark before its one-sentence cause, so that wherever the text lands
# (torchrun's error file, the pod's termination message, a local node's log tail) the operator's
# and the local runner's `failures.failure_of` find its reason, keep the sentence as the failure's
# message, and fail the job at once (operator/failures.py UNRECOVERABLE_RULE) instead of spending
# every restart on it.
UNRECOVERABLE_MARK = "kubetrain-unrecoverable"
UNRECOVERABLE_REASONS = (
    "CheckpointStoreDenied",  # 401/403: the credentials, or what they may do
    "CheckpointStoreNotFound",  # no such bucket
    "CheckpointIncompatible",  # a checkpoint of another configuration or world size
    "CheckpointStoreTakenOver",  # another job writes the same objectStore.url
)
_UNRECOVERABLE = re.compile(r"\[" + UNRECOVERABLE_MARK + r" (?P<reason>[A-Za-z]+)\] (?P<message>[^\n]*)")


def unrecoverable(reason: str, message: str) -> str:
    """The marked text of an unrecoverable failure (`message`: one line, the cause first)."""
    assert reason in UNRECOVERABLE_REASONS, reason
    return f"[{UNRECOVERABLE_MARK} {reason}] {' '.join(message.split())}"


def find_unrecoverable(text: str) -> tuple[str, str] | None:
    """(reason, message) of the last unrecoverable mark in `text` (a log tail, an error file's
    text), or None. A mark whose reason kubetrain does not know counts for nothing."""
    found = [m for m in _UNRECOVERABLE.finditer(text) if m["reason"] in UNRECOVERABLE_REASONS]
    if not found:
        return None
    # The message ends the line; an error file's JSON quoting may close it with `"`.
    return found[-1]["reason"], found[-1]["message"].rstrip('",}').strip()
