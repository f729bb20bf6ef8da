"""`kubetrain run --local`: the pods the operator would create, as processes on this machine.

The pods come from the operator's own renderer (`render.render_pods`); their container's
command, args and env are used as they are, except for the handful of things one machine
cannot share with a cluster. Those are rewritten in exactly one place, `localize_env`, and
listed in `LOCAL_REWRITES` (printed at start and saved in the run directory). spec.template's
volumes, mounts and workingDir are mapped, or refused, by `local/volumes.py`. Everything else in
the pod (image, resources, scheduling) has no local meaning and is ignored.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import yaml

from kubetrain.api import naming
from kubetrain.api.contract import MASTER_ADDR, MASTER_PORT, PET_PREFIX, is_reserved
from kubetrain.api.manifest import InvalidTrainingJob, load, parse
from kubetrain.api.models import TrainingJob
from kubetrain.api.training import CONFIG_ENV, TrainConfig
from kubetrain.local.volumes import NO_CHOICES, LocalChoices, LocalVolumes, UnmappableError, plan_volumes
from kubetrain.operator.render import render_pods

LOCAL_NAMESPACE = "default"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
OMP_NUM_THREADS = "OMP_NUM_THREADS"
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
CHECKPOINTS_SUBDIR = "checkpoints"
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

# The whole difference between a node's pod on a cluster and its process here.
LOCAL_REWRITES: tuple[tuple[str, str], ...] = (
    (
        f"{MASTER_ADDR}, {PET_PREFIX}{MASTER_ADDR}",
        "node 0's DNS name -> 127.0.0.1 (--netns: kept; each namespace's /etc/hosts resolves the pods' names)",
    ),
    (f"{MASTER_PORT}, {PET_PREFIX}{MASTER_PORT}", "spec.masterPort -> a free local port, new for each attempt"),
    (CONFIG_ENV, "checkpoint.dir (the volume's mount path) -> <run-dir>/checkpoints"),
    (CUDA_VISIBLE_DEVICES, "node i gets GPUs [i*gpusPerNode, (i+1)*gpusPerNode) of the visible ones; '' on CPU"),
    (OMP_NUM_THREADS, "the machine's cores shared among all processes (unless set in spec.env)"),
    (PYTHONUNBUFFERED, "1: output is a pipe read line by line"),
    (
        ", ".join(SOCKET_IFNAME_VARS),
        "--netns only: the namespace's interface (gloo/NCCL pick the address of the hostname, "
        "which is a pod's own IP on a cluster but the host's here)",
    ),
)


class LocalRunError(ValueError):
    """Input that cannot run locally; raised before any process starts."""


@dataclass(frozen=True)
class NodeProcess:
    """One node of one attempt: the rendered container, localized."""

    rank: int
    pod_name: str
    argv: list[str]
    # The container env after `localize_env`; the child also inherits this process's env
    # minus the reserved contract names (a stray RANK in the user's shell must not leak in).
    env: dict[str, str]
    # What localize_env changed: name -> (rendered value, local value).
    rewritten: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    netns: str | None = None
    cwd: str | None = None  # spec.template's workingDir, mapped (local/volumes.py)

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        base = os.environ if base is None else base
        env = {name: value for name, value in base.items() if not is_reserved(name)}
        bin_dir = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([bin_dir, *[p for p in env.get("PATH", "").split(os.pathsep) if p]])
        env.update(self.env)
        return env


def apply_overrides(job: TrainingJob, *, nodes: int | None, gpus_per_node: int | None) -> TrainingJob:
    """The job with command-line overrides, validated again by the same models."""
    if nodes is None and gpus_per_node is None:
        return job
    document = job.model_dump(by_alias=True, exclude_none=True, mode="json")
    if nodes is not None:
        document["spec"]["nodes"] = nodes
    if gpus_per_node is not None:
        document["spec"]["gpusPerNode"] = gpus_per_node
    return parse(document, "the job with --nodes/--gpus-per-node applied")


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """GPU ids this process may use, without importing torch: CUDA_VISIBLE_DEVICES, else nvidia-smi."""
    environ = os.environ if environ is None else environ
    if CUDA_VISIBLE_DEVICES in environ:
        return [d.strip() for d in environ[CUDA_VISIBLE_DEVICES].split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [m.group(1) for m in re.finditer(r"^GPU (\d+):", out, re.MULTILINE)]


def device_slices(job: TrainingJob, gpus: Sequence[str]) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each node."""
    per_node = job.spec.gpus_per_node
    if per_node == 0:
        return [""] * job.spec.nodes
    needed = per_node * job.spec.nodes
    if len(gpus) < needed:
        raise LocalRunError(
            f"spec.gpusPerNode: {job.spec.nodes} nodes x {per_node} GPUs need {needed} GPUs, "
            f"this machine shows {len(gpus)} ({','.join(gpus) or 'none'}); use --nodes/--gpus-per-node"
        )
    return [",".join(gpus[rank * per_node : (rank + 1) * per_node]) for rank in range(job.spec.nodes)]


def resolve_env(entries: Sequence[Mapping[str, Any]], pod: Mapping[str, Any], pod_ip: str) -> dict[str, str]:
    """A container's env list as a plain mapping. Pod fields are emulated; Secrets, ConfigMaps and
    container resources exist only on a cluster, so they are refused, naming the variable."""
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
) -> tuple[dict[str, str], dict[str, tuple[str | None, str]]]:
    """The one place a rendered env is changed for a local run (see LOCAL_REWRITES).

    `master_addr` None keeps the rendered DNS name (--netns resolves it). Returns the new env
    and what changed: name -> (rendered value, local value).
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
    rewrites[CUDA_VISIBLE_DEVICES] = cuda_visible_devices
    if OMP_NUM_THREADS not in env:
        rewrites[OMP_NUM_THREADS] = str(threads_per_process)
    rewrites[PYTHONUNBUFFERED] = "1"
    if socket_ifname is not None:
        rewrites.update(dict.fromkeys(SOCKET_IFNAME_VARS, socket_ifname))
    changed = {name: (env.get(name), value) for name, value in rewrites.items() if env.get(name) != value}
    local.update(rewrites)
    return local, changed


@dataclass(frozen=True)
class LocalPlan:
    """Everything a local run needs, computed (and so validated) before anything starts."""

    job: TrainingJob
    run_dir: Path
    uid: str
    devices: list[str]
    node_addrs: list[str]
    netns: list[str] | None = None
    socket_ifname: str | None = None
    volumes: LocalVolumes = field(default_factory=LocalVolumes)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / CHECKPOINTS_SUBDIR

    def threads_per_process(self) -> int:
        return max(1, (os.cpu_count() or 1) // self.job.spec.world_size)

    def pods(self, attempt: int) -> list[dict[str, Any]]:
        return render_pods(self.job, self.job.metadata.namespace or LOCAL_NAMESPACE, self.uid, attempt)

    def nodes(self, attempt: int, master_port: int) -> list[NodeProcess]:
        """The localized node processes of one gang attempt."""
        out = []
        for rank, pod in enumerate(self.pods(attempt)):
            container = next(c for c in pod["spec"]["containers"] if c["name"] == naming.CONTAINER_NAME)
            env, changed = localize_env(
                resolve_env(container.get("env", []), pod, self.node_addrs[rank]),
                master_addr=None if self.netns else self.node_addrs[0],
                master_port=master_port,
                checkpoint_dir=self.checkpoint_dir.resolve(),
                cuda_visible_devices=self.devices[rank],
                threads_per_process=self.threads_per_process(),
                socket_ifname=self.socket_ifname,
            )
            out.append(
                NodeProcess(
                    rank=rank,
                    pod_name=pod["metadata"]["name"],
                    argv=[*container["command"], *container.get("args", [])],
                    env=env,
                    rewritten=changed,
                    netns=self.netns[rank] if self.netns else None,
                )
            )
        return [self.volumes.localize(node, self.run_dir) for node in out]


def default_run_dir(job: TrainingJob, now: str) -> Path:
    return Path("runs") / f"{job.name}-{now}"


def claim_run_dir(default: Path) -> Path:
    """`default`, or else `default-2`, `-3`, ...: the first one this call creates.

    The default name has one-second resolution; two runs of a job started in the same second
    must not share a directory, or the second would resume the first's checkpoints.
    """
    default.parent.mkdir(parents=True, exist_ok=True)
    for number in itertools.count(1):
        candidate = default if number == 1 else default.with_name(f"{default.name}-{number}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")


def make_plan(
    path: str | Path,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    run_dir: Path | None = None,
    now: str = "",
    choices: LocalChoices = NO_CHOICES,
) -> LocalPlan:
    """Load, validate and render everything; raises InvalidTrainingJob or LocalRunError on bad input."""
    job = apply_overrides(load_job(path), nodes=nodes, gpus_per_node=gpus_per_node)
    devices = device_slices(job, visible_gpus() if job.spec.gpus_per_node else [])
    plan = LocalPlan(
        job=job,
        run_dir=run_dir or default_run_dir(job, now),
        uid=str(uuid.uuid4()),
        devices=devices,
        node_addrs=["127.0.0.1"] * job.spec.nodes,
        volumes=plan_volumes(job, choices),
    )
    plan.nodes(attempt=0, master_port=job.spec.master_port)  # refuses unresolvable env now
    return plan


def load_job(path: str | Path) -> TrainingJob:
    job = load(path)
    if job.metadata.name is None:
        raise InvalidTrainingJob(f"{path}: metadata.name: a local run needs a name (generateName is cluster-only)")
    return job


def describe_rewrites(nodes: Sequence[NodeProcess]) -> dict[str, Any]:
    """What the run directory records about the localization, per node."""
    return {
        "rewrites": [{"names": names, "how": how} for names, how in LOCAL_REWRITES],
        "nodes": [
            {
                "rank": node.rank,
                "pod": node.pod_name,
                "argv": node.argv,
                "netns": node.netns,
                "changed": {name: {"rendered": old, "local": new} for name, (old, new) in node.rewritten.items()},
            }
            for node in nodes
        ],
    }


def write_run_files(plan: LocalPlan, nodes: Sequence[NodeProcess]) -> None:
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    plan.checkpoint_dir.mkdir(exist_ok=True)
    (plan.run_dir / "job.yaml").write_text(yaml.safe_dump(plan.job.wire(), sort_keys=False))
    (plan.run_dir / "pods.yaml").write_text(yaml.safe_dump_all(plan.pods(attempt=0), sort_keys=False))
    (plan.run_dir / "local-rewrites.json").write_text(json.dumps(describe_rewrites(nodes), indent=2) + "\n")
    plan.volumes.prepare(plan.run_dir)


def check_command(node: NodeProcess) -> None:
    """Refuse a command that cannot start here before anything starts, naming the field."""
    program = node.argv[0]
    path = node.full_env().get("PATH")
    found = (
        Path(node.cwd or ".", program).is_file() if os.sep in program else shutil.which(program, path=path) is not None
    )
    if not found:
        raise LocalRunError(
            f"spec.command: {program!r} not found "
            + ("(relative paths resolve against the current directory)" if os.sep in program else "on PATH")
        )


def run_local(
    path: str | Path,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    run_dir: Path | None = None,
    netns: bool = False,
    choices: LocalChoices = NO_CHOICES,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """`kubetrain run FILE --local`; returns the exit code (see localrun.EXIT_*)."""
    from kubetrain.local import netns as netns_mod
    from kubetrain.local import supervisor as localrun
    from kubetrain.local.plot import plot_run
    from kubetrain.local.view import make_view

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        plan = make_plan(
            path,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            run_dir=run_dir,
            now=time.strftime("%Y%m%d-%H%M%S"),
            choices=choices,
        )
        for node in plan.nodes(attempt=0, master_port=plan.job.spec.master_port):
            check_command(node)
    except (InvalidTrainingJob, LocalRunError, UnmappableError) as error:
        print(f"error: {error}", file=err)
        return localrun.EXIT_BAD_INPUT
    with contextlib.ExitStack() as stack:
        if netns:
            try:
                pods = plan.pods(attempt=0)
                namespaces = stack.enter_context(
                    netns_mod.node_namespaces(plan.job.name, [netns_mod.pod_hostnames(pod) for pod in pods])
                )
            except netns_mod.NetnsError as error:
                print(f"error: --netns: {error}", file=err)
                return localrun.EXIT_BAD_INPUT
            plan = replace(
                plan,
                node_addrs=[ns.addr for ns in namespaces],
                netns=[ns.name for ns in namespaces],
                socket_ifname=netns_mod.NODE_IFNAME,
            )
        if run_dir is None:
            plan = replace(plan, run_dir=claim_run_dir(plan.run_dir))
        write_run_files(plan, plan.nodes(attempt=0, master_port=plan.job.spec.master_port))
        view = make_view(out)
        try:
            view.begin(plan)
            for line in plan.volumes.describe(plan.run_dir):
                view.notice(line)
            try:
                result = localrun.Supervisor(plan, view).run()
            except localrun.NodeStartError as error:
                view.close()
                print(f"error: {error}", file=err)
                return localrun.EXIT_FAILED
            try:
                result.plot = str(plot_run(plan.run_dir))
            except (OSError, ValueError, ImportError) as error:
                view.notice(f"no plot: {error}")
            (plan.run_dir / "summary.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
            view.end(result)
        finally:
            view.close()
    return result.exit_code
