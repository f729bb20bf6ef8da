"""The in-place gang restart on a real node, with real pods of the trainer image and the operator of
this tree (tests/support/realjobs.py): a worker crash injected on node 1 restarts the gang inside
the same pods and ends with the accuracy of an uninterrupted run; `kubectl delete pod` still
recreates the gang. (KUBETRAIN_TRAINER_IMAGE / KUBETRAIN_TRAINER_OVERLAY=1 run a branch's
trainer on an image built from other sources: see support/realjobs.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from support.realjobs import RealJobs, records
from support.waiting import wait_for

pytestmark = [pytest.mark.node, pytest.mark.timeout(40 * 60)]

NAMESPACE = "inplace"


def condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in job["status"].get("conditions") or [] if c["type"] == kind), None)


def succeeded(job: dict[str, Any]) -> dict[str, Any] | None:
    """The job once it Succeeded (RealJobs.wait returns what the predicate returns)."""
    found = condition(job, "Succeeded")
    return job if found is not None and found["status"] == "True" else None


def test_a_worker_crash_restarts_the_gang_in_the_same_pods_with_the_accuracy_of_an_uninterrupted_run(
    jobs: RealJobs,
) -> None:
    jobs.create("reference")
    crashed = jobs.create("crashed", fault="kill,rank=1,step=30")
    first = wait_for(lambda: len(pods := jobs.pods("crashed")) == 2 and pods, 300, "the crashed job's pods")
    reference = jobs.wait("reference", succeeded, "Succeeded", 900)
    job = jobs.wait("crashed", succeeded, "Succeeded", 900)
    status = job["status"]
    if status["attempt"] != 1:  # the in-place attempt did not go on: what its pods' logs say
        pytest.fail(f"{status}\n--- the logs of attempt 1:\n{jobs.logs('crashed', 1)[-12000:]}")
    assert status["restarts"] == 1, status
    (failure,) = status["failures"]
    assert (failure["rank"], failure["exitCode"], failure["pod"]) == (1, 137, "crashed-node-1"), failure
    assert "worker rank 1" in failure["message"]
    assert jobs.pods("crashed") == first, "the same pods (uids) ran both attempts"
    line = status["timeline"]
    assert (line["attempt"], line["start"]) == (1, "InPlace") and "podsCreatedAt" not in line, line
    assert status["progress"]["accuracy"] == reference["status"]["progress"]["accuracy"]
    resumed = [r for r in records(crashed) if r["event"] == "resume"]
    # Node 0's worker, the survivor, saved step 30 when its peer died: no step lost.
    assert [(r["step"], r["attempt"]) for r in resumed] == [(30, 1)]
    for name in ("reference", "crashed"):
        jobs.delete(name)


def test_a_deleted_pod_recreates_the_gang(jobs: RealJobs) -> None:
    volume = jobs.create("deleted", training={"epochs": 20})
    first = wait_for(lambda: len(pods := jobs.pods("deleted")) == 2 and pods, 300, "the pods")
    wait_for(lambda: any(r["event"] == "step" and r["step"] >= 30 for r in records(volume)), 600, "step 30")
    jobs.kubectl("delete", "pod", "deleted-node-1", "-n", NAMESPACE, "--wait=false")
    job = jobs.wait("deleted", lambda j: j["status"].get("attempt") == 1 and j, "attempt 1")
    assert job["status"]["failures"][0]["reason"] == "PodDeleted" and job["status"]["timeline"]["start"] == "Recreate"
    later = wait_for(lambda: len(pods := jobs.pods("deleted")) == 2 and pods, 300, "the new pods")
    assert set(later.values()).isdisjoint(first.values()), "every pod of the gang was recreated"
    jobs.delete("deleted")
