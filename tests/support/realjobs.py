"""TrainingJobs of the trainer image on the real node (support/node.py), with the operator of this
tree on the host: what the real-node in-place tests (tests/node/test_in_place_node.py) and
benchmarks/recovery.py share.

    with real_jobs(tmp_path, "ns") as jobs:
        volume = jobs.create("j", fault="kill,rank=1,step=30")
        jobs.wait("j", lambda job: ..., "what")
        records(volume)                     # rank 0's metrics records, from the checkpoint volume

The trainer image is the one built from the current sources (tests/cluster/build-images.sh),
or the one KUBETRAIN_TRAINER_IMAGE names (`oci:<layout>:<tag>` or an OCI archive's path);
KUBETRAIN_TRAINER_OVERLAY=1 runs this tree's kubetrain package over the image's (a read-only
hostPath first on PYTHONPATH): for trying a branch's trainer on an image built from other
sources. Neither is for a verdict on a release.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubetrain.api.records import records_in
from support import controlplane, images
from support import node as real
from support.jobs import bare_job
from support.operator_process import KUBETRAIN, OperatorProcess
from support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
IMAGE_ENV = "KUBETRAIN_TRAINER_IMAGE"
OVERLAY_ENV = "KUBETRAIN_TRAINER_OVERLAY"
OVERLAY_PATH = "/opt/kubetrain-overlay"


def trainer_image() -> images.Loadable:
    given = os.environ.get(IMAGE_ENV)
    return images.loadable(images.TRAINER_REF, given) if given else images.node_images(images.TRAINER_REF)[0]


def operator_image() -> images.Loadable:
    """The operator image: the pods' runtime init container runs it (spec.runtime.inject)."""
    return images.node_images(images.OPERATOR_REF)[0]


def overlay_tree(into: Path) -> Path:
    """A snapshot of this tree's kubetrain package (its editable install's links resolved),
    readable by the pods' non-root user."""
    import kubetrain

    shutil.copytree(Path(kubetrain.__path__[0]), into / "kubetrain", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [into, *into.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    into.parent.chmod(0o755)
    return into


# The user scripts of the adapters' tests (tests/support/workloads/), given to a job's pods read-only.
WORKLOADS = ROOT / "tests" / "support" / "workloads"
WORKLOADS_PATH = "/workloads"


def job_manifest(
    name: str,
    namespace: str,
    *,
    fault: str | None = None,
    strategy: str = "InPlace",
    overlay: Path | None = None,
    training: dict[str, Any] | None = None,
    run_policy: dict[str, Any] | None = None,
    command: list[str] | None = None,
    args: list[str] | None = None,
    image: str = images.TRAINER_REF,
    workloads: bool = False,
    inject_runtime: bool = True,
    checkpoint_steps: int = 20,
) -> dict[str, Any]:
    """A 2-node digits job of the trainer image, its checkpoints on the PVC `name`. `workloads`:
    WORKLOADS at WORKLOADS_PATH (a read-only hostPath), for a `command` of a user script."""
    env = [{"name": "KUBETRAIN_FAULT", "value": fault}] if fault else []
    spec: dict[str, Any] = {
        "nodes": 2,
        "gpusPerNode": 0,
        "image": image,
        "imagePullPolicy": "Never",
        "env": env,
        "training": {"dataset": "digits", "epochs": 3, "batchSize": 32, "logEverySteps": 5, **(training or {})},
        "checkpoint": {
            "dir": "/checkpoints",
            "everySteps": checkpoint_steps,
            "keep": 2,
            "volume": {"persistentVolumeClaim": {"claimName": name}},
        },
        "runPolicy": {"maxRestarts": 3, "restartStrategy": strategy, **(run_policy or {})},
    }
    if command is not None:
        spec["command"] = command
    if args is not None:
        spec["args"] = args
    if not inject_runtime:
        spec["runtime"] = {"inject": False}
    folders = {"workloads": (WORKLOADS, WORKLOADS_PATH)} if workloads else {}
    if overlay is not None:
        env.append({"name": "PYTHONPATH", "value": OVERLAY_PATH})
        folders["overlay"] = (overlay, OVERLAY_PATH)
    if folders:  # host folders, read-only
        mounts = [{"name": name, "mountPath": path, "readOnly": True} for name, (_, path) in folders.items()]
        volumes = [
            {"name": name, "hostPath": {"path": str(host), "type": "Directory"}} for name, (host, _) in folders.items()
        ]
        spec["template"] = {"spec": {"containers": [{"name": "trainer", "volumeMounts": mounts}], "volumes": volumes}}
    return bare_job(name, metadata={"namespace": namespace}, **spec)


def pvc(name: str, namespace: str) -> dict[str, Any]:
    """A claim bound to the real node's hostPath PersistentVolume of the same name."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def records(volume: Path) -> list[dict[str, Any]]:
    """Rank 0's metrics records, from the checkpoint volume's metrics.jsonl."""
    metrics = volume / "metrics.jsonl"
    return records_in(metrics.read_text()) if metrics.exists() else []


@dataclass
class RealJobs:
    node: Any  # support.node.RealNode
    namespace: str
    overlay: Path | None
    operator: OperatorProcess

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        done: subprocess.CompletedProcess[str] = self.node.cp.kubectl(*args, input=input, check=check, timeout=60)
        return done

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))

    def create(self, name: str, **options: Any) -> Path:
        """The job `name` (job_manifest's options) and its checkpoint volume: the volume's directory."""
        volume: Path = self.node.hostpath_volume(name)
        self.apply(pvc(name, self.namespace), job_manifest(name, self.namespace, overlay=self.overlay, **options))
        return volume

    def job(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", "tj", name, "-n", self.namespace, "-o", "json").stdout)
        return found

    def wait(self, name: str, predicate: Callable[[dict[str, Any]], Any], what: str, timeout: float = 600) -> Any:
        return wait_for(lambda: predicate(self.job(name)), timeout, f"{name}: {what}", interval=0.2)

    def pod_objects(self, name: str) -> list[dict[str, Any]]:
        """The job's pods as the API serves them, those being deleted too."""
        out = self.kubectl("get", "pods", "-n", self.namespace, "-l", f"kubetrain.dev/job-name={name}", "-o", "json")
        found: list[dict[str, Any]] = json.loads(out.stdout)["items"]
        return found

    def pods(self, name: str) -> dict[str, str]:
        """Pod name -> uid of the job's pods that are not being deleted."""
        return {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in self.pod_objects(name)
            if not p["metadata"].get("deletionTimestamp")
        }

    def logs(self, name: str, attempt: int) -> str:
        """Every node's log of `attempt` as `kubetrain logs` prints it (from the pods, else the
        attempt's archive), with what it said on stderr: for an assertion's message."""
        args = [str(KUBETRAIN), "logs", name, "-n", self.namespace, "--attempt", str(attempt)]
        env = {**os.environ, "KUBECONFIG": str(self.node.cp.kubeconfig)}
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
        return done.stdout + done.stderr

    def delete(self, name: str) -> None:
        self.kubectl("delete", "tj", name, "-n", self.namespace, "--wait=false", check=False)
        self.kubectl("delete", "pvc", name, "-n", self.namespace, "--wait=false", check=False)
        wait_for(lambda: not self.pods(name), 120, f"{name}: its pods gone")


@contextlib.contextmanager
def real_jobs(workdir: Path, namespace: str, *, overlay: bool | None = None) -> Iterator[RealJobs]:
    """The real node with the trainer image, kubetrain's CRD, `namespace`, and the operator of
    this tree on the host (its log in `workdir`). `overlay` None: KUBETRAIN_TRAINER_OVERLAY says."""
    loadables = [trainer_image(), operator_image()]
    if overlay is None:
        overlay = os.environ.get(OVERLAY_ENV) == "1"
    with real.running_node() as node:
        tree = overlay_tree(workdir / "overlay") if overlay else None
        node.load_images(loadables)
        controlplane.install_crds(node.cp, ROOT / "crds")
        node.cp.kubectl("create", "namespace", namespace)
        sa = ("get", "sa", "default", "-n", namespace)
        wait_for(lambda: node.cp.kubectl(*sa, check=False).returncode == 0, 30, "the default ServiceAccount")
        operator = OperatorProcess(Path(node.cp.kubeconfig), workdir / "operator.log", namespaces=namespace).start()
        try:
            yield RealJobs(node, namespace, tree, operator)
        finally:
            operator.stop()


def ready(pod: dict[str, Any]) -> bool:
    """Whether the pod's Ready condition is True (in-place jobs: its torchrun agent runs its workers)."""
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def worker_pids(job: str, namespace: str, node_rank: int) -> list[int]:
    """Host PIDs of the workers torchrun started in node `node_rank`'s pod of `job`: the processes
    with that pod's rendezvous env (MASTER_ADDR names the job's node 0, NODE_RANK) whose parent has
    it too (the container's first process, torchrun's agent, does not: its parent is the shim)."""
    wanted = (f"MASTER_ADDR={job}-node-0.{job}.{namespace}.".encode(), f"\0NODE_RANK={node_rank}\0".encode())
    ours: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = b"\0" + (proc / "environ").read_bytes()
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone, or not ours to read
            continue
        if all(part in environ for part in wanted):
            ours[int(proc.name)] = parent
    return sorted(pid for pid, parent in ours.items() if parent in ours)
