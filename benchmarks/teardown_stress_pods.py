"""Teardown in real pods: consecutive 2-node TrainingJobs on the real node with the trainer image as
built, every other one with node 1's pod deleted mid-run, the host's cores saturated.

    sudo .venv/bin/python benchmarks/teardown_stress_pods.py [--jobs 20] [--load N] [--output FILE]

The real node of the tests (tests/support/node.py: containerd, a kubelet, its own control plane)
gets both images of the Dockerfile (tests/cluster/build-images.sh builds them) and the operator
through the chart (support.release, as the end-to-end scenario installs it). Then `--jobs` short
digits jobs run one after the other, each with its own hostPath checkpoint volume, restarts
allowed (maxRestarts 3, so a teardown crash would show as a restart) and cleanPodPolicy None,
so that every pod stays to be read. `--load` busy loops (default: one per core) run on the host
meanwhile.

Odd-numbered jobs are interrupted at a known point, never by racing the run: KUBETRAIN_FAULT
makes rank 1 hang at step HANG_STEP (once per job: its marker lives on the checkpoint volume),
which holds rank 0 in the next all-reduce too; once rank 1 logged the fault and rank 0 logged a
checkpoint, node 1's pod is deleted. The gang restarts and resumes from the checkpoint.

Every pod's log is followed from the moment its container starts (`kubectl logs -f`, one per pod
uid: a gang restart reuses the pods' names), so the pods the restart deletes are read too.
Counted per job: Succeeded and its reason (CompletedWithStragglers would mean a rank was left
running after `done`), restarts, pods still Running once the job Succeeded, seconds from rank 0's
`done` to the last container's exit, and the lines with "terminate called" (a C++ abort), "exit
barrier" (torchrun's agent) and "Traceback" in every pod's log. Results go to
benchmarks/results/teardown_stress_pods.json (or --output).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import images, release  # noqa: E402
from support import node as real  # noqa: E402
from support.controlplane import Unavailable, find_tool  # noqa: E402
from support.providers import NodeProvider  # noqa: E402
from support.waiting import wait_for  # noqa: E402
from teardown_stress import MARKERS, busy_load, write_report  # noqa: E402

from kubetrain.api import naming  # noqa: E402
from kubetrain.api.records import records_in  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "teardown_stress_pods.json"
NAMESPACE = "stress"
EPOCHS = 3  # 22 steps an epoch on 2 nodes: 66 steps
CHECKPOINT_EVERY = 10
HANG_STEP = 15  # after the first checkpoint (step 10), before the second
JOB_TIMEOUT_S = 900
PROBE = "import sys, torch; print(torch.__version__, 'hooks', 'kubetrain.runtime.torchrun_hooks' in sys.modules)"
FAULT_LINE = f"injecting hang at step {HANG_STEP}"


def job(name: str, claim: str, interrupted: bool) -> dict[str, Any]:
    env = [{"name": "KUBETRAIN_FAULT", "value": f"hang,rank=1,step={HANG_STEP}"}] if interrupted else []
    return {
        "apiVersion": "kubetrain.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodes": 2,
            "gpusPerNode": 0,
            "image": release.TRAINER_IMAGE,
            "imagePullPolicy": "Never",
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            "env": env,
            "training": {"dataset": "digits", "epochs": EPOCHS, "batchSize": 32, "logEverySteps": 5},
            "checkpoint": {
                "dir": "/checkpoints",
                "everySteps": CHECKPOINT_EVERY,
                "keep": 2,
                "volume": {"persistentVolumeClaim": {"claimName": claim}},
            },
            "runPolicy": {"maxRestarts": 3, "cleanPodPolicy": "None", "activeDeadlineSeconds": JOB_TIMEOUT_S},
        },
    }


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": name, "resources": {"requests": {"storage": "1Gi"}}},
    }


@dataclass
class PodLogs:
    """Follows the log of every pod of one job, by uid, from its container's start to its end."""

    node: real.RealNode
    job: str
    folder: Path
    followers: dict[str, tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.thread = threading.Thread(target=self._watch, name=f"logs-{self.job}", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.wait(1):
            for pod in self.pods():
                uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
                statuses = pod.get("status", {}).get("containerStatuses") or []
                started = any("running" in s.get("state", {}) or "terminated" in s.get("state", {}) for s in statuses)
                if uid not in self.followers and started:
                    self._follow(name, uid, pod["metadata"]["labels"].get(naming.LABEL_ATTEMPT, "?"))

    def _follow(self, name: str, uid: str, attempt: str) -> None:
        path = self.folder / f"{name}-attempt{attempt}-{uid[:8]}.log"
        kubectl = str(find_tool("kubectl"))
        env = {**os.environ, "KUBECONFIG": str(self.node.cp.kubeconfig)}
        with path.open("wb") as out:
            proc = subprocess.Popen(
                [kubectl, "logs", "-f", "-n", NAMESPACE, name, "-c", "trainer"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.followers[uid] = (name, proc, path)

    def pods(self) -> list[dict[str, Any]]:
        got = self.node.cp.kubectl(
            "get", "pods", "-n", NAMESPACE, "-l", f"{naming.LABEL_JOB}={self.job}", "-o", "json", check=False
        )
        return list(json.loads(got.stdout)["items"]) if got.returncode == 0 else []

    def text(self, name: str) -> str:
        """What the followers of pods called `name` have read so far (all attempts)."""
        return "".join(path.read_text(errors="replace") for n, _, path in list(self.followers.values()) if n == name)

    def finish(self, timeout_s: float) -> dict[str, str]:
        """Stop watching; wait for the followers (their containers ended); log file -> text."""
        self.stop.set()
        self.thread.join()
        deadline = time.monotonic() + timeout_s
        for _, proc, _ in self.followers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            if proc.poll() is None:  # a container that never ended: counted by the caller
                proc.kill()
                proc.wait()
        return {path.name: path.read_text(errors="replace") for _, _, path in self.followers.values()}


def condition(doc: dict[str, Any], kind: str) -> dict[str, Any] | None:
    found = [c for c in doc.get("status", {}).get("conditions", []) if c["type"] == kind and c["status"] == "True"]
    return found[0] if found else None


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def one_job(node: real.RealNode, index: int, interrupted: bool, folder: Path) -> dict[str, Any]:
    """Run one job to its end and read everything about it; then delete it with its pods and volume."""
    name = f"stress-{index:02d}"
    volume = f"{name}-checkpoints"
    cp = node.cp
    node.hostpath_volume(volume)
    cp.kubectl("apply", "-f", "-", input=json.dumps(claim(volume)))
    result: dict[str, Any] = {"job": name, "interrupted": interrupted, "load_average_at_start": os.getloadavg()}
    applied = time.time()
    cp.kubectl("apply", "-f", "-", input=json.dumps(job(name, volume, interrupted)))
    logs = PodLogs(node, name, folder / name)
    try:
        if interrupted:

            def held() -> bool:
                checkpoints = [r for r in records_in(logs.text(naming.pod_name(name, 0))) if r["event"] == "checkpoint"]
                return bool(checkpoints) and FAULT_LINE in logs.text(naming.pod_name(name, 1))

            wait_for(held, JOB_TIMEOUT_S, f"{name}: rank 1 held at step {HANG_STEP} after a checkpoint", interval=1)
            cp.kubectl("delete", "pod", naming.pod_name(name, 1), "-n", NAMESPACE, "--wait=false")
            result["deleted_after_s"] = round(time.time() - applied, 1)

        def ended() -> dict[str, Any] | None:
            doc = json.loads(cp.kubectl("get", "trainingjob", name, "-n", NAMESPACE, "-o", "json").stdout)
            return doc if condition(doc, "Succeeded") or condition(doc, "Failed") else None

        doc = wait_for(ended, JOB_TIMEOUT_S, f"{name} Succeeded or Failed", interval=1)
        result["apply_to_end_s"] = round(time.time() - applied, 1)
        result.update(judge(doc, logs.pods(), logs.finish(timeout_s=60), interrupted))
    except AssertionError as error:  # a job that did not end in time: recorded, and the run goes on
        result.update({"clean": False, "error": str(error), "pods_at_end": phases(logs.pods())})
        result["log_tails"] = {log: text[-3000:] for log, text in logs.finish(timeout_s=5).items()}
    finally:
        logs.stop.set()
        cp.kubectl("delete", "trainingjob", name, "-n", NAMESPACE, "--wait=true", timeout=180, check=False)
        cp.kubectl("delete", "pods", "-n", NAMESPACE, "-l", f"{naming.LABEL_JOB}={name}", "--wait=true", timeout=180)
        cp.kubectl("delete", "pvc", volume, "-n", NAMESPACE, "--wait=true", timeout=120)
        cp.kubectl("delete", "pv", volume, "--wait=true", timeout=120)
    return result


def phases(pods: list[dict[str, Any]]) -> dict[str, str | None]:
    return {f"{p['metadata']['name']} ({p['metadata']['uid'][:8]})": p["status"].get("phase") for p in pods}


def judge(doc: dict[str, Any], pods: list[dict[str, Any]], texts: dict[str, str], interrupted: bool) -> dict[str, Any]:
    """The counts of one ended job, from its status, its pods as they are now and their logs."""
    status = doc["status"]
    succeeded = condition(doc, "Succeeded")
    done_at = status.get("progress", {}).get("doneAt")
    exits = [
        stamp(s["state"]["terminated"]["finishedAt"])
        for pod in pods
        for s in pod["status"].get("containerStatuses") or []
        if "terminated" in s.get("state", {})
    ]
    markers = {
        key: sum(text in line for log in texts.values() for line in log.splitlines()) for key, text in MARKERS.items()
    }
    found: dict[str, Any] = {
        "succeeded": succeeded is not None,
        "reason": (succeeded or condition(doc, "Failed") or {}).get("reason"),
        # Gang restarts of any kind: a deleted pod is a disruption, counted apart (uncountedRestarts).
        "restarts": status.get("restarts", 0) + status.get("uncountedRestarts", 0),
        "failures": [f.get("reason") for f in status.get("failures", [])],
        "pods_at_end": phases(pods),
        "left_running": sum(p["status"].get("phase") == "Running" for p in pods),
        "done_to_last_exit_s": round(max(exits) - stamp(done_at), 1) if done_at and exits else None,
        "logs_read": len(texts),
        "markers": markers,
    }
    found["clean"] = (
        found["succeeded"]
        and found["reason"] == "AllNodesSucceeded"
        and found["left_running"] == 0
        and found["restarts"] == (1 if interrupted else 0)
        and not markers["terminate_called"]
        and not markers["exit_barrier"]
    )
    if not found["clean"]:
        found["log_tails"] = {log: text[-3000:] for log, text in texts.items()}
    return found


def totals(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    gaps = sorted(j["done_to_last_exit_s"] for j in jobs if j.get("done_to_last_exit_s") is not None)
    walls = sorted(j["apply_to_end_s"] for j in jobs if "apply_to_end_s" in j)
    return {
        "jobs": len(jobs),
        "interrupted": sum(j["interrupted"] for j in jobs),
        "clean": sum(j.get("clean", False) for j in jobs),
        "succeeded": sum(j.get("succeeded", False) for j in jobs),
        "succeeded_all_nodes": sum(j.get("reason") == "AllNodesSucceeded" for j in jobs),
        "restarts_where_deleted": sum(j.get("restarts", 0) for j in jobs if j["interrupted"]),
        "restarts_elsewhere": sum(j.get("restarts", 0) for j in jobs if not j["interrupted"]),
        "pods_left_running": sum(j.get("left_running", 0) for j in jobs),
        **{f"lines_{key}": sum(j.get("markers", {}).get(key, 0) for j in jobs) for key in MARKERS},
        "done_to_last_exit_s_max": gaps[-1] if gaps else None,
        "apply_to_end_s_median": walls[len(walls) // 2] if walls else None,
        "apply_to_end_s_max": walls[-1] if walls else None,
    }


def trainer_torch(node: real.RealNode) -> str:
    """The trainer image's torch and whether its .pth loads the torchrun hooks, as a pod of it
    reports them (not a guess from the Dockerfile)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "torch-version", "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "c",
                    "image": release.TRAINER_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", PROBE],
                }
            ],
        },
    }
    node.cp.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def finished() -> bool:
        phase = node.cp.kubectl("get", "pod", "torch-version", "-n", NAMESPACE, "-o", "jsonpath={.status.phase}")
        return phase.stdout in ("Succeeded", "Failed")

    wait_for(finished, 300, "the trainer image's torch version", interval=1)
    version = node.cp.kubectl("logs", "torch-version", "-n", NAMESPACE).stdout.strip()
    node.cp.kubectl("delete", "pod", "torch-version", "-n", NAMESPACE, "--wait=true", timeout=120)
    return version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20, help="consecutive jobs; every other one is interrupted")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy-loop processes (default: cores)")
    parser.add_argument("--output", type=Path, default=RESULT, help="result JSON (default: %(default)s)")
    parser.add_argument("--keep", type=Path, help="keep the pods' logs here (default: a temporary dir)")
    parser.add_argument(
        "--images",
        nargs=2,
        metavar=("OPERATOR", "TRAINER"),
        help="images to load, oci:<layout>:<tag> or OCI archives (default: those built for these sources)",
    )
    args = parser.parse_args()
    reason = real.missing()
    if reason:
        sys.exit(f"no real node here: {reason}")
    if args.images:
        refs = (images.OPERATOR_REF, images.TRAINER_REF)
        loadables = [images.loadable(ref, spec) for ref, spec in zip(refs, args.images, strict=True)]
    else:
        try:
            loadables = images.node_images(images.OPERATOR_REF, images.TRAINER_REF)
        except Unavailable as missing:
            sys.exit(str(missing))
    load_before = os.getloadavg()
    start = time.monotonic()
    jobs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="teardown-pods-")))
        node = stack.enter_context(real.running_node())
        node.load_images(loadables)
        release.install_operator(NodeProvider(node))
        node.cp.kubectl("create", "namespace", NAMESPACE)
        torch_version = trainer_torch(node)
        setup_s = time.monotonic() - start
        stack.enter_context(busy_load(args.load))
        for index in range(args.jobs):
            result = one_job(node, index, interrupted=index % 2 == 1, folder=folder)
            jobs.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "log_tails"}), flush=True)
        load_after = os.getloadavg()
    report = {
        "benchmark": "teardown_stress_pods",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "logical_cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_before": load_before,
            "load_average_after_jobs": load_after,
        },
        "setup": {
            "jobs": args.jobs,
            "busy_loops": args.load,
            "trainer_image": release.TRAINER_IMAGE,
            "images": [str(item[1] if isinstance(item, tuple) else item) for item in loadables],
            "trainer_torch": torch_version,
            "epochs": EPOCHS,
            "checkpoint_every_steps": CHECKPOINT_EVERY,
            "interrupt": f"KUBETRAIN_FAULT=hang,rank=1,step={HANG_STEP}, then node 1's pod deleted",
            "node_and_operator_setup_s": round(setup_s, 1),
        },
        "wall_s": round(time.monotonic() - start, 1),
        "totals": totals(jobs),
        "jobs": jobs,
    }
    write_report(args.output, report, "totals")


if __name__ == "__main__":
    main()
