"""The plan of a local run: the job's rendered pods as node processes, validated before anything starts.

The pods come from the operator's own renderer (`render.render_pods`); `kubetrain.local.localize`
changes the few things one machine cannot share with a cluster. spec.template's volumes, mounts
and workingDir are mapped, or refused, by `kubetrain.local.volumes`. Everything else in the pod
(image, resources, scheduling) has no local meaning and is ignored.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubetrain.api import naming
from kubetrain.api.contract import OBJECT_STORE_CREDENTIALS, is_reserved
from kubetrain.api.manifest import InvalidTrainingJob, load, parse
from kubetrain.api.models import TrainingJob
from kubetrain.local.localize import (
    CUDA_VISIBLE_DEVICES,
    LOCAL_REWRITES,
    LocalRunError,
    expand,
    expand_env,
    localize_env,
    resolve_env,
)
from kubetrain.local.volumes import NO_CHOICES, LocalChoices, LocalVolumes, plan_volumes
from kubetrain.operator.render import render_pods
from kubetrain.operator.settings import RenderSettings

# A local node loads kubetrain's runtime itself (its PYTHONPATH starts with the runtime's loader,
# localize.SITE_DIR): the pods are rendered without the operator's runtime init container.
LOCAL_RENDER = RenderSettings(runtime_image="")

LOCAL_NAMESPACE = "default"
ATTEMPTS_SUBDIR = "attempts"
CHECKPOINTS_SUBDIR = "checkpoints"
PODS_SUBDIR = "pods"


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

    def attempt_file(self, rank: int) -> Path:
        """Node `rank`'s stand-in for its pod's attempt label file (the downward API's)."""
        return (self.run_dir / PODS_SUBDIR / f"node-{rank}" / naming.ATTEMPT_FILE).resolve()

    def threads_per_process(self) -> int:
        return max(1, (os.cpu_count() or 1) // self.job.spec.world_size)

    def pods(self, attempt: int) -> list[dict[str, Any]]:
        return render_pods(self.job, self.job.metadata.namespace or LOCAL_NAMESPACE, self.uid, attempt, LOCAL_RENDER)

    def nodes(self, attempt: int, master_port: int) -> list[NodeProcess]:
        """The localized node processes of one gang attempt."""
        out = []
        store = self.job.spec.checkpoint.object_store
        from_host = OBJECT_STORE_CREDENTIALS if store is not None and store.credentials_secret is not None else ()
        for rank, pod in enumerate(self.pods(attempt)):
            container = next(c for c in pod["spec"]["containers"] if c["name"] == naming.CONTAINER_NAME)
            entries = container.get("env", [])
            env, changed = localize_env(
                resolve_env(entries, pod, self.node_addrs[rank], from_host),
                master_addr=None if self.netns else self.node_addrs[0],
                master_port=master_port,
                checkpoint_dir=self.checkpoint_dir.resolve(),
                cuda_visible_devices=self.devices[rank],
                threads_per_process=self.threads_per_process(),
                socket_ifname=self.socket_ifname,
                inherited_pythonpath=os.environ.get("PYTHONPATH"),
                attempt_file=self.attempt_file(rank),
            )
            # As the kubelet does, with the local values: env values first, then command and args.
            env = expand_env(env, [entry["name"] for entry in entries if "valueFrom" not in entry])
            out.append(
                NodeProcess(
                    rank=rank,
                    pod_name=pod["metadata"]["name"],
                    argv=[expand(arg, env) for arg in [*container["command"], *container.get("args", [])]],
                    env=env,
                    rewritten=changed,
                    netns=self.netns[rank] if self.netns else None,
                )
            )
        return [self.volumes.localize(node, self.run_dir) for node in out]


def attempt_log(run_dir: Path, attempt: int, rank: int) -> Path:
    """Node `rank`'s output in `attempt` of the latest run in `run_dir` (local/supervisor.py
    writes it; the operator keeps the same per-attempt tails in a cluster, docs/logs.md)."""
    return run_dir / ATTEMPTS_SUBDIR / str(attempt) / naming.log_archive_key(rank)


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
    return plan_job(job, run_dir=run_dir or default_run_dir(job, now), choices=choices)


def plan_job(job: TrainingJob, *, run_dir: Path, choices: LocalChoices = NO_CHOICES) -> LocalPlan:
    """The plan of a validated job (`make_plan` for a file; kubetrain.client for a model); raises
    LocalRunError or UnmappableError on what this machine cannot run, before anything starts."""
    if job.spec.run_policy.suspend:
        # The operator would hold the gang until the field is cleared; nothing clears it here.
        raise LocalRunError("spec.runPolicy.suspend: a suspended job starts no pods; set it to false to run it")
    devices = device_slices(job, visible_gpus() if job.spec.gpus_per_node else [])
    plan = LocalPlan(
        job=job,
        run_dir=run_dir,
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


def check_commands(plan: LocalPlan) -> None:
    """Refuse, naming the field, a node command that cannot start here."""
    for node in plan.nodes(attempt=0, master_port=plan.job.spec.master_port):
        check_command(node)


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
