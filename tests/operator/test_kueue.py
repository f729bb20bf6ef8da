"""operator/kueue.py: the Workload a job gets, what the operator reads from it (run, hold,
hand back the quota), and the statuses it writes, as pure functions; and decide() holding a
job for a queue. (tests/operator/test_kueue_cluster.py runs them against the real Kueue.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.decisions import advance
from support.jobs import valid_job
from support.pods import JOB_UID as UID
from support.pods import T0, pod_view

from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.operator import kueue
from kubetrain.operator.conditions import get_condition
from kubetrain.operator.decision import Hold
from kubetrain.operator.render import render_pod
from kubetrain.operator.settings import RenderSettings
from kubetrain.operator.status import decide

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
EARLIER = "2026-11-23T07:00:00Z"


def queued_job(priority: str | None = None, **spec: Any) -> TrainingJob:
    doc = valid_job("train", **spec)
    doc["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team", **({kueue.PRIORITY_LABEL: priority} if priority else {})}
    doc["metadata"]["uid"] = UID
    return TrainingJob.model_validate(doc)


def workload(*conditions: tuple[str, str, str], admission: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {"type": t, "status": s, "reason": r, "message": f"{t} {r}", "lastTransitionTime": EARLIER}
            for t, s, r in conditions
        ]
    }
    if admission is not None:
        status["admission"] = admission
    return {"metadata": {"name": "trainingjob-train", "generation": 1}, "status": status}


def test_only_labelled_jobs_are_queued() -> None:
    assert kueue.queue_name(queued_job()) == "team"
    assert kueue.queue_name(TrainingJob.model_validate(valid_job("train"))) is None
    assert kueue.EXTERNAL_FRAMEWORK == "TrainingJob.v1alpha1.kubetrain.dev"


@pytest.mark.parametrize(("priority", "value"), [(None, None), ("high", 1000)])
def test_the_workload_is_one_pod_set_of_the_rendered_pod(priority: str | None, value: int | None) -> None:
    job = queued_job(priority, nodes=3, gpusPerNode=2, resources={"requests": {"cpu": "4"}})
    pod = render_pod(job, "ns", UID, 0, 0, RenderSettings())
    wl = kueue.render_workload(job, "ns", UID, pod, value)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["metadata"]["name"] == "trainingjob-train"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == UID
    assert wl["metadata"]["ownerReferences"][0]["controller"] is True
    (pod_set,) = wl["spec"]["podSets"]
    assert pod_set["count"] == 3
    assert pod_set["template"]["spec"] == {k: v for k, v in pod["spec"].items() if k != "hostname"}
    assert "kubetrain.dev/node-rank" not in pod_set["template"]["metadata"]["labels"]
    assert pod_set["template"]["metadata"]["labels"]["kubetrain.dev/job-name"] == "train"
    requests = pod_set["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": "4", "nvidia.com/gpu": "2"}
    assert wl["spec"]["queueName"] == "team" and wl["spec"]["active"] is True
    if priority is None:
        assert "priorityClassRef" not in wl["spec"] and "priority" not in wl["spec"]
    else:
        ref = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": priority}
        assert wl["spec"]["priorityClassRef"] == ref and wl["spec"]["priority"] == value


ADMISSION = {"clusterQueue": "cq", "podSetAssignments": [{"name": "nodes", "flavors": {"cpu": "a", "gpu": "b"}}]}
RESERVED, UNRESERVED = ("QuotaReserved", "True", "QuotaReserved"), ("QuotaReserved", "False", "Pending")
ADMITTED, PREEMPTED_NOW = ("Admitted", "True", "Admitted"), ("Evicted", "True", "Preempted")


@pytest.mark.parametrize(
    ("wl", "pods_left", "reason", "flavors", "acknowledge"),
    [
        (workload(), False, "WaitingForAdmission", (), False),
        (workload(UNRESERVED), False, "WaitingForAdmission", (), False),
        (workload(RESERVED, ADMITTED, admission=ADMISSION), True, None, ("a", "b"), False),
        # Evicted: held at once, and the quota handed back only once the pods are gone.
        (workload(RESERVED, ADMITTED, PREEMPTED_NOW, admission=ADMISSION), True, "EvictedPreempted", (), False),
        (workload(RESERVED, PREEMPTED_NOW, admission=ADMISSION), False, "EvictedPreempted", (), True),
        (workload(UNRESERVED, PREEMPTED_NOW), False, "EvictedPreempted", (), False),
        (workload(RESERVED, ("Evicted", "True", "Evicted"), admission=ADMISSION), False, "Evicted", (), True),
        # Re-admitted: Kueue turned Evicted False.
        (
            workload(RESERVED, ADMITTED, ("Evicted", "False", "QuotaReserved"), admission=ADMISSION),
            False,
            None,
            ("a", "b"),
            False,
        ),
    ],
)
def test_admission(
    wl: dict[str, Any], pods_left: bool, reason: str | None, flavors: tuple[str, ...], acknowledge: bool
) -> None:
    verdict = kueue.admission(queued_job(), wl, pods_left)
    assert (verdict.hold.reason if verdict.hold else None) == reason
    assert verdict.flavors == flavors and verdict.acknowledge == acknowledge
    if verdict.hold is not None:
        assert verdict.hold.disruption == reason.startswith("Evicted")
        assert "trainingjob-train" in verdict.hold.message


def test_an_elastic_workload_may_be_admitted_down_to_its_minimum() -> None:
    """Kueue's partial admission (beta, on by default): pod set minCount = elastic.minNodes, and the
    admitted count read back from the assignment."""
    job = queued_job(nodes=3, elastic={"minNodes": 2}, command=["python", "train.py"])
    (pod_set,) = kueue.render_workload(job, "ns", UID, render_pod(job, "ns", UID, 0, 0, RenderSettings()), None)[
        "spec"
    ]["podSets"]
    assert (pod_set["count"], pod_set["minCount"]) == (3, 2)
    fixed = queued_job(nodes=3)
    (fixed_set,) = kueue.render_workload(fixed, "ns", UID, render_pod(fixed, "ns", UID, 0, 0, RenderSettings()), None)[
        "spec"
    ]["podSets"]
    assert "minCount" not in fixed_set, "a fixed gang is admitted whole or not at all"
    partial = {"clusterQueue": "cq", "podSetAssignments": [{**ADMISSION["podSetAssignments"][0], "count": 2}]}
    assert kueue.admission(job, workload(RESERVED, ADMITTED, admission=partial), False).count == 2
    assert kueue.admission(job, workload(RESERVED, ADMITTED, admission=ADMISSION), False).count is None


def test_waiting_names_the_queue_and_kueues_reason() -> None:
    hold = kueue.admission(queued_job(), workload(UNRESERVED), False).hold
    assert hold is not None
    expected = "waiting for Kueue to admit Workload trainingjob-train in LocalQueue team: QuotaReserved Pending"
    assert hold.message == expected


def test_placement_merges_the_flavors_node_labels_and_tolerations() -> None:
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    spot = {"key": "spot", "operator": "Exists"}
    flavors = [
        {"spec": {"nodeLabels": {"pool": "a"}, "tolerations": [gpu]}},
        {"spec": {"nodeLabels": {"zone": "z1"}, "tolerations": [gpu, spot]}},
        {"spec": {}},
    ]
    where = kueue.placement(flavors)
    assert where == kueue.Placement({"pool": "a", "zone": "z1"}, (gpu, spot))
    pod = {"metadata": {}, "spec": {"nodeSelector": {"disk": "ssd"}, "tolerations": [gpu]}}
    placed = kueue.place(pod, where)
    assert placed["spec"] == {"nodeSelector": {"disk": "ssd", "pool": "a", "zone": "z1"}, "tolerations": [gpu, spot]}
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}  # not mutated
    assert kueue.place(pod, kueue.Placement()) is pod


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


@pytest.mark.parametrize(
    ("reason", "requeued"), [("Preempted", "True"), ("NodeFailures", "True"), ("Deactivated", "False")]
)
def test_acknowledging_an_eviction_hands_the_quota_back(reason: str, requeued: str) -> None:
    wl = workload(RESERVED, ADMITTED, ("Evicted", "True", reason), admission=ADMISSION)
    status = kueue.acknowledge_eviction(wl, NOW)
    assert "admission" not in status and "admission" in wl["status"]
    assert _conditions(status) == {
        "QuotaReserved": ("False", "Pending"),
        "Admitted": ("False", "NoReservation"),
        "Evicted": ("True", reason),
        "Requeued": (requeued, reason),
    }
    times = {c["type"]: c["lastTransitionTime"] for c in status["conditions"]}
    assert times["QuotaReserved"] == "2026-11-23T08:00:00Z" and times["Evicted"] == EARLIER


def test_finish_marks_the_workload_finished_once() -> None:
    wl = workload(ADMITTED)
    status = kueue.finish(wl, True, "all 2 nodes exited 0", NOW)
    assert status is not None and _conditions(status)["Finished"] == ("True", "Succeeded")
    assert kueue.finish({**wl, "status": status}, True, "again", NOW) is None
    failed = kueue.finish(wl, False, "no restarts left", NOW)
    assert failed is not None and _conditions(failed)["Finished"] == ("True", "Failed")


# --- decide() with a hold ----------------------------------------------------------------

WAITING = Hold("WaitingForAdmission", "waiting for Kueue to admit Workload w in LocalQueue team")
PREEMPTED = Hold("EvictedPreempted", "Kueue evicted Workload w (Preempted)", disruption=True)


def test_a_held_job_creates_nothing_and_says_why() -> None:
    d = decide(queued_job(), UID, [], False, T0, hold=WAITING)
    assert not d.create_ranks and not d.create_service and d.status.phase == "Suspended"
    suspended = get_condition(d.status, "Suspended")
    assert suspended is not None and (suspended.reason, suspended.message) == (WAITING.reason, WAITING.message)
    assert d.status.attempt == 0 and d.status.uncounted_restarts == 0


def test_a_preempted_gang_is_deleted_uncharged_and_comes_back_as_a_new_attempt() -> None:
    job = queued_job(nodes=2)
    running = TrainingJobStatus.model_validate({"attempt": 0, "restarts": 0, "startTime": "2026-11-23T07:00:00Z"})
    job = job.model_copy(update={"status": running})
    pods = [pod_view(job, r, phase="Running") for r in range(2)]
    d = decide(job, UID, pods, True, T0, hold=PREEMPTED)
    assert len(d.delete_pods) == 2 and d.commit_first
    assert (d.status.attempt, d.status.restarts, d.status.uncounted_restarts) == (1, 0, 1)
    assert [e.reason for e in d.events] == ["Suspended"]
    held = advance(job, d)
    again = decide(held, UID, [], True, T0 + timedelta(seconds=5), hold=PREEMPTED)
    assert again.status.uncounted_restarts == 1 and not again.events  # counted once
    resumed = decide(held, UID, [], True, T0 + timedelta(minutes=1))
    assert resumed.create_ranks == [0, 1] and resumed.status.attempt == 1
    condition = get_condition(resumed.status, "Suspended")
    assert condition is not None and (condition.status, condition.reason) == ("False", "Resumed")


def test_waiting_then_evicted_is_announced() -> None:
    waiting = decide(queued_job(), UID, [], False, T0, hold=WAITING)
    job = advance(queued_job(), waiting)
    d = decide(job, UID, [], False, T0, hold=PREEMPTED)
    assert [e.reason for e in d.events] == ["Suspended"] and d.status.uncounted_restarts == 0


RESPEC = [
    # (runPolicy.suspend, the Workload's spec, its conditions, the spec written or None)
    (False, {"queueName": "team"}, (), None),
    (False, {"queueName": "team", "active": True}, (), None),
    (True, {"queueName": "team"}, (), {"queueName": "team", "active": False}),
    (True, {"queueName": "team", "active": False}, (), None),
    (False, {"queueName": "team", "active": False}, (), {"queueName": "team", "active": True}),
    # Relabelled to another LocalQueue: followed until quota is reserved.
    (False, {"queueName": "old"}, (UNRESERVED,), {"queueName": "team", "active": True}),
    (False, {"queueName": "old"}, (RESERVED,), None),
]


@pytest.mark.parametrize(("suspend", "spec", "conditions", "written"), RESPEC)
def test_the_workload_follows_suspend_and_the_queue_label(
    suspend: bool, spec: dict[str, Any], conditions: tuple[tuple[str, str, str], ...], written: dict[str, Any] | None
) -> None:
    job = queued_job(runPolicy={"suspend": suspend})
    wl = {**workload(*conditions), "spec": spec}
    assert kueue.respec(job, wl) == written
