"""Recovery on the real node: from a fault to the first training step after it, in-place and recreate.

Each run is one TrainingJob (digits, 2 nodes, the trainer image on the real node of the tests,
tests/support/node.py; the operator from this tree on the host; a hostPath checkpoint volume)
under runPolicy.restartStrategy InPlace or Recreate, and one fault while it trains:

  crash    node 1's worker SIGKILLs itself after step FAULT_STEP (KUBETRAIN_FAULT kill)
  delete   `kubectl delete pod <job>-node-1` once rank 0 passed FAULT_STEP
  evict    the Eviction API on node 1's pod once rank 0 passed FAULT_STEP
  hang     node 1's worker blocks after FAULT_STEP (KUBETRAIN_FAULT hang), hangTimeoutSeconds HANG_S
           (30: chosen when the stall clock still timed start-up, where a cold start took 10-15 s
           here under load; startupTimeoutSeconds times it apart now)
  suspend  runPolicy.suspend true once rank 0 passed FAULT_STEP, false once the pods are gone

Measured from rank 0's records on the checkpoint volume (every step is logged): the time from
the fault (the fault's own marker for crash and hang, the API call for delete and evict, the
resume for suspend) to rank 0's first step of the next attempt; the steps lost (the last step
the stopped attempt recorded minus the step the next attempt resumed from); the job's status.timeline
(its phases, their sum, and how far that sum is from the measured time); the pod uids before
and after; the load averages. Runs of both strategies alternate, so each pair meets the same
load.

    sudo .venv/bin/python benchmarks/recovery.py [--repeats 3] [--kinds crash,delete,...]
        [--overlay] [--output FILE]

--overlay runs this tree's kubetrain over the image's (a hostPath mount first on PYTHONPATH),
for images built from other sources; the JSON records it. Needs root, the real node's
binaries and the trainer image (tests/cluster/build-images.sh). Writes
benchmarks/results/recovery.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

from support import node as real  # noqa: E402
from support.images import Loadable  # noqa: E402
from support.realjobs import IMAGE_ENV, RealJobs, job_manifest, pvc, real_jobs, records, trainer_image  # noqa: E402
from support.waiting import wait_for  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "recovery.json"
KINDS = ("crash", "delete", "evict", "hang", "suspend")
MODES = ("InPlace", "Recreate")
# The mechanisms the in-place restart was chosen against (docs/recovery.md), for a crash only:
# torchrun's own --max-restarts (its agents restart cold workers by themselves; the operator is
# not asked), and Kubernetes 1.36's container restart rules (RestartAllContainers: the kubelet
# restarts the pod's containers, torchrun and all; pods made here without the operator).
MECHANISMS = ("TorchrunRestarts", "RestartAllContainers")
NAMESPACE = "recovery"
FAULT_STEP = 30
HANG_S = 30
CHECKPOINT_STEPS = 20
# The targets (docs/recovery.md).
TARGET_RATIO = 1 / 3
TARGET_IN_PLACE_S = 10.0
TARGET_TIMELINE_S = 1.0
TARGET_LAUNCH_S = 2.0


def manifest(name: str, kind: str, mode: str, overlay: Path | None) -> dict[str, Any]:
    fault = {"crash": f"kill,rank=1,step={FAULT_STEP}", "hang": f"hang,rank=1,step={FAULT_STEP}"}.get(kind)
    command = (
        ["torchrun", "--max-restarts=3", "-m", "kubetrain.trainer", "train"] if mode == "TorchrunRestarts" else None
    )
    return job_manifest(
        name,
        NAMESPACE,
        fault=fault,
        strategy="InPlace" if mode == "InPlace" else "Recreate",
        overlay=overlay,
        # Every step logged: the first step after the fault is measured to the step.
        training={"epochs": 200, "logEverySteps": 1},
        run_policy={"cleanPodPolicy": "All", **({"hangTimeoutSeconds": HANG_S} if kind == "hang" else {})},
        command=command,
        checkpoint_steps=CHECKPOINT_STEPS,
    )


def kubelet_rule_objects(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's Service and pods as the operator renders them (attempt 0), with no owner and the
    trainer container restarted by the kubelet, all of the pod's containers, on any failure."""
    from kubetrain.api.models import TrainingJob
    from kubetrain.operator.render import render_pods, render_service

    job = TrainingJob.model_validate(manifest)
    uid = f"bench-{job.name}"
    objects = [render_service(job, NAMESPACE, uid), *render_pods(job, NAMESPACE, uid, 0)]
    for obj in objects:
        del obj["metadata"]["ownerReferences"]
    for pod in objects[1:]:
        trainer = pod["spec"]["containers"][0]
        trainer["restartPolicy"] = "Never"
        trainer["restartPolicyRules"] = [
            {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}
        ]
    return objects


class LogKeeper:
    """Keeps every container log the node writes (a hard link per file, taken every second), so
    a run that went wrong can be read after its pods and their logs were deleted."""

    def __init__(self, pod_logs: Path, into: Path) -> None:
        self.pod_logs, self.into = pod_logs, into
        self.stop = threading.Event()
        into.mkdir(parents=True, exist_ok=True)
        threading.Thread(target=self._loop, name="log-keeper", daemon=True).start()

    def _loop(self) -> None:
        while not self.stop.wait(1.0):
            for log in self.pod_logs.glob("*/*/*.log"):
                kept = self.into / f"{log.parent.parent.name}-{log.name}"
                if not kept.exists():
                    with contextlib.suppress(OSError):
                        os.link(log, kept)

    def save(self, job: str, where: Path) -> None:
        """Copy the logs of `job`'s pods to `where`."""
        where.mkdir(parents=True, exist_ok=True)
        for kept in self.into.glob(f"{NAMESPACE}_{job}-node-*"):
            shutil.copy(kept, where / kept.name)


class Bench:
    """One run after another on `jobs`: each a job, its fault, its recovery."""

    def __init__(self, jobs: RealJobs, logs: LogKeeper | None = None, failed_logs: Path | None = None) -> None:
        self.jobs = jobs
        self.count = 0
        self.logs, self.failed_logs = logs, failed_logs

    def run(self, kind: str, mode: str) -> dict[str, Any]:
        self.count += 1
        jobs, name = self.jobs, f"{kind}-{mode.lower()}-{self.count}"
        volume: Path = jobs.node.hostpath_volume(name)
        job = manifest(name, kind, mode, jobs.overlay)
        jobs.apply(pvc(name, NAMESPACE), *(kubelet_rule_objects(job) if mode == "RestartAllContainers" else [job]))
        load_before = os.getloadavg()

        def last_step() -> int:
            return max((r["step"] for r in records(volume) if r["event"] == "step"), default=-1)

        wait_for(lambda: last_step() >= FAULT_STEP - 5, 600, f"{name}: training up to step {FAULT_STEP - 5}")
        before = jobs.pods(name)
        fault_at = self.fault(name, kind, volume, last_step)

        def recovered() -> tuple[dict[str, Any], dict[str, Any]] | None:
            """The next run's `start` record and its first step, both after the fault."""
            after = [r for r in records(volume) if r["time"] > fault_at]
            start = next((r for r in after if r["event"] == "start"), None)
            if start is None:
                return None
            step = next((r for r in after if r["event"] == "step" and r["time"] >= start["time"]), None)
            return None if step is None else (start, step)

        start, first = wait_for(recovered, 600, f"{name}: the first step after the fault")
        # The last step the stopped attempt recorded (a stop by SIGTERM runs on to the step it saves).
        steps_before = [r["step"] for r in records(volume) if r["event"] == "step" and r["time"] < start["time"]]
        lost_from = max(steps_before, default=0)
        measured = first["time"] - fault_at
        result: dict[str, Any] = {
            "kind": kind,
            "mode": mode,
            "recovery_s": round(measured, 3),
            "steps_lost": lost_from - start["step"],
            "last_step": lost_from,
            "resumed_step": start["step"],
        }
        if mode in MODES:
            result |= self.status_of(name, measured)
        result["same_pods"] = before == jobs.pods(name)
        if result.get("failure") == "InPlaceRestartTimedOut" and self.logs is not None and self.failed_logs:
            # The in-place attempt did not meet: its pods' logs say why (kept before they were deleted).
            self.logs.save(name, self.failed_logs / name)
            # The other two sides of it: the operator's decision and relabel, the kubelet's refresh
            # of the pods' attempt files (each log whole: the runs before show what is usual).
            for log in (jobs.operator.log_path, jobs.node.logs / "kubelet.log"):
                if log.exists():
                    shutil.copy(log, self.failed_logs / name / log.name)
        result["load_avg_1m"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
        if mode == "RestartAllContainers":
            jobs.kubectl(
                "delete", "pods,services", "-n", NAMESPACE, "-l", f"kubetrain.dev/job-name={name}", "--wait=false"
            )
        jobs.delete(name)
        return result

    def status_of(self, name: str, measured: float) -> dict[str, Any]:
        """What the job's status says of the restart; its timeline against the measured time."""

        def folded(job: dict[str, Any]) -> dict[str, Any] | None:
            # The operator folds rank 0's records into the timeline within its start-up read interval.
            line = job["status"].get("timeline") or {}
            return job if line.get("firstStepAt") and line.get("attempt") == job["status"].get("attempt") else None

        status = self.jobs.wait(name, folded, "the timeline's first step", 60)["status"]
        line = status["timeline"]
        timeline_s = _seconds(line)
        launch = None
        if line.get("start") == "InPlace" and line.get("detectedAt") and line.get("workersStartedAt"):
            launch = round(_parse(line["workersStartedAt"]) - _parse(line["detectedAt"]), 3)
        return {
            # The in-place restart's own part: from the operator's decision to node 0's agent
            # starting the next attempt's workers (its order reached the agents; docs/recovery.md).
            "decision_to_launch_s": launch,
            "attempt": status["attempt"],
            "restarts": status.get("restarts", 0),
            "uncounted_restarts": status.get("uncountedRestarts", 0),
            "failure": (status.get("failures") or [{}])[-1].get("reason"),
            "timeline": {k: v for k, v in line.items() if k != "waitingOn"},
            "timeline_s": timeline_s,
            "timeline_vs_measured_s": None if timeline_s is None else round(timeline_s - measured, 3),
            "timeline_monotone": _monotone(line),
        }

    def fault(self, name: str, kind: str, volume: Path, last_step: Callable[[], int]) -> float:
        """Cause the fault; its time (epoch seconds)."""
        jobs = self.jobs
        if kind in ("crash", "hang"):
            marker = volume / ".faults" / f"{'kill' if kind == 'crash' else 'hang'}-rank1-step{FAULT_STEP}"
            wait_for(marker.exists, 600, f"{name}: the {kind} fault firing")
            return float(marker.read_text().split()[0])
        wait_for(lambda: last_step() >= FAULT_STEP, 600, f"{name}: step {FAULT_STEP}")
        pod = f"{name}-node-1"
        # Through the API client, not a kubectl process: kubectl's own start (0.5-2 s on these
        # loaded cores) would count as recovery time the job's timeline cannot see.
        from kubernetes import client

        with jobs.node.cp.api_client() as api:
            core = client.CoreV1Api(api)
            if kind == "delete":
                at = time.time()
                core.delete_namespaced_pod(pod, NAMESPACE)
                return at
            if kind == "evict":
                eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=NAMESPACE))
                at = time.time()
                core.create_namespaced_pod_eviction(pod, NAMESPACE, eviction)
                return at
            self.suspend(api, name, True)
            wait_for(lambda: not jobs.pods(name), 300, f"{name}: suspended, pods gone")
            at = time.time()
            self.suspend(api, name, False)
            return at

    @staticmethod
    def suspend(api: Any, name: str, value: bool) -> None:
        from kubernetes import client

        patch = {"spec": {"runPolicy": {"suspend": value}}}
        custom = client.CustomObjectsApi(api)
        custom.patch_namespaced_custom_object("kubetrain.dev", "v1alpha1", NAMESPACE, "trainingjobs", name, patch)


TIMES = (
    "failedAt",
    "detectedAt",
    "podsCreatedAt",
    "podsScheduledAt",
    "containersStartedAt",
    "workersStartedAt",
    "rendezvousAt",
    "firstStepAt",
)


def _parse(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _monotone(line: dict[str, Any]) -> bool:
    times = [_parse(line[key]) for key in TIMES if key in line]
    return times == sorted(times)


def _seconds(line: dict[str, Any]) -> float | None:
    origin = line.get("failedAt") or line.get("detectedAt") or line.get("podsCreatedAt")
    if origin is None or "firstStepAt" not in line:
        return None
    return round(_parse(line["firstStepAt"]) - _parse(origin), 3)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 2) if values else None

    table: dict[str, Any] = {}
    for kind in dict.fromkeys(r["kind"] for r in runs):
        row: dict[str, Any] = {}
        for mode in (*MODES, *MECHANISMS):
            mine = [r for r in runs if r["kind"] == kind and r["mode"] == mode]
            if mine:
                row[mode] = {
                    "recovery_s": median([r["recovery_s"] for r in mine]),
                    "range_s": [min(r["recovery_s"] for r in mine), max(r["recovery_s"] for r in mine)],
                    "steps_lost": median([r["steps_lost"] for r in mine]),
                    "same_pods": all(r["same_pods"] for r in mine),
                    "timeline_vs_measured_s": [r.get("timeline_vs_measured_s") for r in mine],
                    "runs": len(mine),
                }
                launches = [r["decision_to_launch_s"] for r in mine if r.get("decision_to_launch_s") is not None]
                if launches:
                    row[mode]["decision_to_launch_s"] = {"median": median(launches), "max": max(launches)}
        if "InPlace" in row and "Recreate" in row and row["Recreate"]["recovery_s"]:
            row["in_place_over_recreate"] = round(row["InPlace"]["recovery_s"] / row["Recreate"]["recovery_s"], 3)
        table[kind] = row
    crash = table.get("crash", {})
    direct = [r for r in runs if r["kind"] in ("crash", "delete", "evict", "suspend") and r["mode"] in MODES]
    in_place = [r for r in runs if r["mode"] == "InPlace" and r["kind"] in ("crash", "hang")]
    targets = {
        # Every in-place run restarted in place (its pods kept, no InPlaceRestartTimedOut), each
        # within TARGET_LAUNCH_S of its decision.
        "in_place_runs_restarted_in_place": all(
            r["same_pods"] and r.get("failure") != "InPlaceRestartTimedOut" for r in in_place
        ),
        "in_place_decision_to_launch_at_most_2s": all(
            r.get("decision_to_launch_s") is not None and r["decision_to_launch_s"] <= TARGET_LAUNCH_S for r in in_place
        ),
        "crash_in_place_over_recreate_at_most_1/3": crash.get("in_place_over_recreate") is not None
        and crash["in_place_over_recreate"] <= TARGET_RATIO,
        "crash_in_place_at_most_10s": (crash.get("InPlace") or {}).get("recovery_s") is not None
        and crash["InPlace"]["recovery_s"] <= TARGET_IN_PLACE_S,
        "timeline_monotone": all(r["timeline_monotone"] for r in runs if "timeline_monotone" in r),
        "timeline_within_1s_of_measured": all(
            r["timeline_vs_measured_s"] is not None and abs(r["timeline_vs_measured_s"]) <= TARGET_TIMELINE_S
            for r in direct
        ),
    }
    return {"table": table, "targets": targets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"of {', '.join((*MODES, *MECHANISMS))} (the last two: crash only)"
    )
    parser.add_argument("--overlay", action="store_true", help="run this tree's kubetrain over the image's")
    parser.add_argument(
        "--image", help="the trainer image: oci:<layout>:<tag> or an OCI archive (default: the current sources')"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted({*kinds} - set(KINDS)) + sorted({*modes} - set(MODES) - set(MECHANISMS))
    if unknown:
        sys.exit(f"unknown kinds or modes: {', '.join(unknown)}")
    reason = real.missing()
    if reason:
        sys.exit(f"no real node here: {reason}")
    if args.image is not None:
        os.environ[IMAGE_ENV] = args.image
    image = trainer_image()
    started = time.time()
    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="kubetrain-recovery-") as tmp,
        real_jobs(Path(tmp), NAMESPACE, overlay=args.overlay) as jobs,
    ):
        keeper = LogKeeper(jobs.node.workdir / "pod-logs", Path(tmp) / "kept-logs")
        bench = Bench(jobs, keeper, args.output.with_suffix(".logs"))
        try:
            for repeat in range(args.repeats):
                for kind in kinds:
                    # Alternate which strategy goes first: each pair meets the same load.
                    for mode in modes if repeat % 2 == 0 else list(reversed(modes)):
                        if mode in MECHANISMS and kind != "crash":
                            continue
                        runs.append(bench.run(kind, mode))
                        print(json.dumps({k: v for k, v in runs[-1].items() if k != "timeline"}), flush=True)
        finally:
            if "Traceback" in (log := jobs.operator.log()):
                print(log[-5000:], file=sys.stderr)
        # Written before the node's teardown, whose host checks may still fail.
        write_results(args, image, runs, started)


def write_results(args: argparse.Namespace, image: Loadable, runs: list[dict[str, Any]], started: float) -> None:
    result = {
        "benchmark": "recovery on the real node: fault -> first training step after it, InPlace vs Recreate",
        "job": {
            "nodes": 2,
            "dataset": "digits",
            "fault_step": FAULT_STEP,
            "checkpoint_every": CHECKPOINT_STEPS,
            "hang_timeout_s": HANG_S,
            "operator_progress_interval_s": 2,
        },
        "image": str(image[1] if isinstance(image, tuple) else image),
        "overlay": bool(args.overlay),
        "repeats": args.repeats,
        **summarize(runs),
        "runs": runs,
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
        "wall_s": round(time.time() - started, 1),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("table", "targets")}, indent=2))


if __name__ == "__main__":
    main()
