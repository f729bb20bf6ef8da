"""The one place a rendered pod's env is changed for a local run.

`kubetrain run --local` runs the operator's own rendered pods; their container's command, args
and env are used as they are, except for the handful of things one machine cannot share with a
cluster. Those are listed in `LOCAL_REWRITES` (printed at start and saved in the run directory)
and applied by `localize_env`; `resolve_env` emulates the pod fields a `fieldRef` may read.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubetrain.api.contract import (
    AGENT_PORT_ENV,
    AGENT_TOKEN_ENV,
    ATTEMPT_FILE_ENV,
    CHECKPOINT_DIR_ENV,
    MASTER_ADDR,
    MASTER_PORT,
    OBJECT_STORE_CREDENTIALS,
    PET_PREFIX,
)
from kubetrain.api.training import CONFIG_ENV, TrainConfig
from kubetrain.runtime import bundle


class LocalRunError(ValueError):
    """Input that cannot run locally; raised before any process starts."""


CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
OMP_NUM_THREADS = "OMP_NUM_THREADS"
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
PYTHONPATH = "PYTHONPATH"

# The runtime's loader (a sitecustomize that loads kubetrain.runtime.torchrun_hooks): what the
# trainer image's .pth does; the operator's init container copies it into other images
# (kubetrain.runtime.bundle).
SITE_DIR = bundle.SITE_DIR
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# What the trainer's object-store client (obstore) reads besides the credentials themselves (it reads
# variables, not ~/.aws profiles): the nodes inherit it from the environment `kubetrain run` was
# started in, as they inherit everything not reserved.
AWS_SETTINGS = ("AWS_REGION",)
CREDENTIALS_FIELD = "checkpoint.objectStore.credentialsSecret"

# The whole difference between a node's pod on a cluster and its process here.
LOCAL_REWRITES: tuple[tuple[str, str], ...] = (
    (
        f"{MASTER_ADDR}, {PET_PREFIX}{MASTER_ADDR}",
        "node 0's DNS name -> 127.0.0.1 (--netns: kept; each namespace's /etc/hosts resolves the pods' names)",
    ),
    (f"{MASTER_PORT}, {PET_PREFIX}{MASTER_PORT}", "spec.masterPort -> a free local port, new for each attempt"),
    (f"{CONFIG_ENV}, {CHECKPOINT_DIR_ENV}", "checkpoint.dir (the volume's mount path) -> <run-dir>/checkpoints"),
    (
        ATTEMPT_FILE_ENV,
        "the pod's attempt label (a downward API file) -> <run-dir>/pods/node-<i>/attempt, written by kubetrain "
        "(an in-place restart moves a node to the next attempt there)",
    ),
    (
        f"{AGENT_PORT_ENV}, {AGENT_TOKEN_ENV}",
        "'' and none (no readiness probe and no orders over the network locally: kubetrain reads the agents' "
        "records and writes the attempt files itself)",
    ),
    (
        ", ".join(OBJECT_STORE_CREDENTIALS),
        f"{CREDENTIALS_FIELD} (a Secret) -> the AWS_* credentials of your environment, where set "
        f"(and {', '.join(AWS_SETTINGS)})",
    ),
    (CUDA_VISIBLE_DEVICES, "node i gets GPUs [i*gpusPerNode, (i+1)*gpusPerNode) of the visible ones; '' on CPU"),
    (OMP_NUM_THREADS, "the machine's cores shared among all processes (unless set in spec.env)"),
    (PYTHONUNBUFFERED, "1: output is a pipe read line by line"),
    (
        PYTHONPATH,
        "kubetrain's torchrun hooks first (clean exits for any script, as the trainer image's .pth gives a pod), "
        "then the job's or your own",
    ),
    (
        ", ".join(SOCKET_IFNAME_VARS),
        "--netns only: the namespace's interface (gloo/NCCL pick the address of the hostname, "
        "which is a pod's own IP on a cluster but the host's here)",
    ),
)


def resolve_env(
    entries: Sequence[Mapping[str, Any]], pod: Mapping[str, Any], pod_ip: str, from_host: Collection[str] = ()
) -> dict[str, str]:
    """A container's env list as a plain mapping. Pod fields are emulated; Secrets, ConfigMaps and
    container resources exist only on a cluster, so they are refused, naming the variable, but for
    the names `from_host` (checkpoint.objectStore.credentialsSecret's): left out, so the nodes
    inherit them from this process's environment where it has them."""
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "spec.nodeName": socket.gethostname(),
        "status.podIP": pod_ip,
        "status.hostIP": pod_ip,
    }
    env: dict[str, str] = {}
    for entry in entries:
        name = entry["name"]
        if name == AGENT_TOKEN_ENV:  # the operator's Secret: no operator orders the agents here
            continue
        if name in from_host:  # the cluster's Secret: this environment's credentials instead
            continue
        if "valueFrom" not in entry:
            env[name] = str(entry.get("value", ""))
            continue
        source = entry["valueFrom"]
        path = source.get("fieldRef", {}).get("fieldPath")
        if path in fields:
            env[name] = fields[path]
            continue
        kind = next(iter(source), "valueFrom")
        raise LocalRunError(
            f"spec.env: {name} takes its value from {kind}"
            + (f" {path!r}" if path else "")
            + f", which exists only on a cluster; locally only value and fieldRef ({', '.join(fields)}) work"
        )
    return env


def localize_env(
    env: Mapping[str, str],
    *,
    master_addr: str | None,
    master_port: int,
    checkpoint_dir: Path,
    cuda_visible_devices: str,
    threads_per_process: int,
    socket_ifname: str | None = None,
    inherited_pythonpath: str | None = None,
    attempt_file: Path | None = None,
) -> tuple[dict[str, str], dict[str, tuple[str | None, str]]]:
    """The one place a rendered env is changed for a local run (see LOCAL_REWRITES).

    `master_addr` None keeps the rendered DNS name (--netns resolves it). `inherited_pythonpath`:
    this process's PYTHONPATH, kept after the job's own. `attempt_file`: the node's stand-in for
    the pod's attempt label file. Returns the new env and what changed:
    name -> (rendered value, local value).
    """
    local = dict(env)
    rewrites: dict[str, str] = {}
    for name in (MASTER_ADDR, PET_PREFIX + MASTER_ADDR):
        if name in env and master_addr is not None:
            rewrites[name] = master_addr
    for name in (MASTER_PORT, PET_PREFIX + MASTER_PORT):
        if name in env:
            rewrites[name] = str(master_port)
    if CONFIG_ENV in env:
        config = TrainConfig.model_validate_json(env[CONFIG_ENV])
        config.checkpoint.dir = str(checkpoint_dir)
        rewrites[CONFIG_ENV] = config.to_env_value()
    if CHECKPOINT_DIR_ENV in env:
        rewrites[CHECKPOINT_DIR_ENV] = str(checkpoint_dir)
    if ATTEMPT_FILE_ENV in env and attempt_file is not None:
        rewrites[ATTEMPT_FILE_ENV] = str(attempt_file)
    if AGENT_PORT_ENV in env:
        rewrites[AGENT_PORT_ENV] = ""
    rewrites[CUDA_VISIBLE_DEVICES] = cuda_visible_devices
    if OMP_NUM_THREADS not in env:
        rewrites[OMP_NUM_THREADS] = str(threads_per_process)
    rewrites[PYTHONUNBUFFERED] = "1"
    paths = [str(SITE_DIR), env.get(PYTHONPATH, ""), inherited_pythonpath or ""]
    rewrites[PYTHONPATH] = os.pathsep.join(p for p in paths if p)
    if socket_ifname is not None:
        rewrites.update(dict.fromkeys(SOCKET_IFNAME_VARS, socket_ifname))
    changed = {name: (env.get(name), value) for name, value in rewrites.items() if env.get(name) != value}
    local.update(rewrites)
    return local, changed


# `$$` (an escaped `$`) or `$(NAME)`: NAME is everything up to the first `)`. Any other `$` (a
# trailing one, `$x`, a `$(` with no `)` after it) stays as it is.
_REFERENCE = re.compile(r"\$(\$|\(([^)]*)\))")


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion of a container's command, args and env values
    (k8s.io/kubernetes third_party/forked/golang/expansion): `$(NAME)` becomes the variable's
    value, `$$` becomes `$`, and a reference to an unknown name is left as it is."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "$":
            return "$"
        return variables.get(match.group(2), match.group(0))

    return _REFERENCE.sub(replace, text)


def expand_env(env: Mapping[str, str], literal: Collection[str]) -> dict[str, str]:
    """The env with the `literal` values (those given as `value`, not `valueFrom`) expanded in
    order, as the kubelet does: each sees only the variables defined before it."""
    expanded: dict[str, str] = {}
    for name, value in env.items():
        expanded[name] = expand(value, expanded) if name in literal else value
    return expanded
