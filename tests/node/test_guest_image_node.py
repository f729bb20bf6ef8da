"""Scripts as users write them, in an image with torch and no kubetrain, on the real node: the
operator's runtime init container gives their pods kubetrain's runtime (docs/images.md).

The image (docker.io/kubetrain/guest:0.1.0-cpu, tests/cluster/build-images.sh) is the trainer
image with kubetrain, pydantic and the hooks' .pth removed and transformers, accelerate and
lightning added; the scripts are tests/support/workloads/, mounted read-only. Each job's pods
must turn Ready (the injected agent answers the readiness probe), and:
- Hugging Face: `kubectl delete pod` of node 1 mid-run loses 0 steps, and the deleted pod is gone
  within seconds; status shows progress and lastCheckpoint;
- a worker SIGKILL restarts the gang in place (the same pod UIDs, Ready again), which Succeeds;
- Lightning Succeeds with its progress in status.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from support import images
from support.realjobs import RealJobs, ready, records, worker_pids
from support.waiting import wait_for

pytestmark = [pytest.mark.node, pytest.mark.timeout(40 * 60)]

NAMESPACE = "guest"
SAVE_STEPS = 20


def condition(job: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in job["status"].get("conditions") or [])


def hf_args(max_steps: int) -> list[str]:
    return ["--max_steps", str(max_steps), "--save_steps", str(SAVE_STEPS)]


def guest_job(jobs: RealJobs, name: str, script: str, args: list[str]) -> Path:
    return jobs.create(
        name,
        image=images.GUEST_REF,
        command=["torchrun", f"/workloads/{script}"],
        args=args,
        workloads=True,
    )


def pods_ready(jobs: RealJobs, name: str, attempt: int) -> dict[str, str] | None:
    """Pod name -> uid once both pods of `attempt` are Ready."""
    pods = [p for p in jobs.pod_objects(name) if not p["metadata"].get("deletionTimestamp")]
    ours = [p for p in pods if p["metadata"]["labels"].get("kubetrain.dev/attempt") == str(attempt) and ready(p)]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in ours} if len(ours) == len(pods) == 2 else None


def test_hugging_face_deleted_pod_loses_no_step_and_goes_in_seconds(jobs: RealJobs) -> None:
    volume = guest_job(jobs, "hf", "hf_gpt2.py", hf_args(1_000_000))
    wait_for(lambda: pods_ready(jobs, "hf", 0), 600, "the pods Ready (the injected agent answers)")
    job = jobs.wait(
        "hf",
        lambda j: (j["status"].get("lastCheckpoint") or {}).get("step", 0) >= SAVE_STEPS and j,
        "lastCheckpoint of the first periodic save in status",
        600,
    )
    progress = job["status"]["progress"]
    assert progress["step"] >= SAVE_STEPS and progress["totalSteps"] == 1_000_000, progress
    uid = jobs.pods("hf")["hf-node-1"]
    jobs.kubectl("delete", "pod", "hf-node-1", "-n", NAMESPACE, "--wait=false")
    deleted = time.monotonic()
    wait_for(lambda: uid not in {p["metadata"]["uid"] for p in jobs.pod_objects("hf")}, 150, "the deleted pod gone")
    gone_s = time.monotonic() - deleted
    job = jobs.wait("hf", lambda j: j["status"].get("attempt") == 1 and j, "attempt 1", 300)
    resumed = wait_for(
        lambda: next((r for r in records(volume) if r.get("attempt") == 1 and r["event"] == "start"), None),
        600,
        "attempt 1's start record",
    )
    first = [r for r in records(volume) if r.get("attempt", 0) == 0]
    reached = max(r["step"] for r in first if r["event"] == "step")
    saved = [r for r in first if r["event"] == "checkpoint" and r.get("reason") == "signal"]
    print(
        f"\nHF on the guest image: reached step {reached}, saved {saved}, resumed at {resumed['step']}, "
        f"the deleted pod gone {gone_s:.1f} s after the delete"
    )
    assert [r["step"] for r in saved] == [reached], "the stop saved the step the gang had reached"
    assert resumed["step"] == reached, f"steps lost: {reached - resumed['step']}"
    assert gone_s < 30, f"the deleted pod took {gone_s:.1f} s to go"
    assert job["status"]["failures"][0]["reason"] == "PodDeleted"
    jobs.delete("hf")


def test_a_killed_worker_restarts_in_the_same_pods_which_turn_ready_and_succeed(jobs: RealJobs) -> None:
    guest_job(jobs, "killed", "hf_gpt2.py", hf_args(200))
    first = wait_for(lambda: pods_ready(jobs, "killed", 0), 600, "the pods Ready")
    jobs.wait("killed", lambda j: (j["status"].get("progress") or {}).get("step", 0) >= 5, "step 5", 600)
    (worker,) = wait_for(lambda: worker_pids("killed", NAMESPACE, 1), 60, "node 1's worker")
    os.kill(worker, signal.SIGKILL)
    again = wait_for(lambda: pods_ready(jobs, "killed", 1), 300, "the pods Ready in attempt 1")
    assert again == first, "the same pods (uids) run attempt 1"
    job = jobs.wait("killed", lambda j: condition(j, "Succeeded") and j, "Succeeded", 900)
    status = job["status"]
    assert (status["attempt"], status["restarts"], status["timeline"]["start"]) == (1, 1, "InPlace"), status
    assert status["failures"][0]["exitCode"] == 137 and status["failures"][0]["pod"] == "killed-node-1"
    assert status["progress"]["step"] == 200
    jobs.delete("killed")


def test_lightning_succeeds_with_its_progress_in_status(jobs: RealJobs) -> None:
    guest_job(jobs, "lightning", "lightning_train.py", ["60", "0.02"])
    wait_for(lambda: pods_ready(jobs, "lightning", 0), 600, "the pods Ready")
    job = jobs.wait("lightning", lambda j: condition(j, "Succeeded") and j, "Succeeded", 900)
    status = job["status"]
    assert (status["progress"]["step"], status["progress"]["totalSteps"]) == (60, 60), status["progress"]
    assert status["lastCheckpoint"]["path"].startswith("/checkpoints/"), status["lastCheckpoint"]
    assert status["restarts"] == 0
    jobs.delete("lightning")
