"""The controller's apply step against a recording fake of kube.py: what it writes for a new
job, that its expectations stop a second creation before the watch catches up, that the
watches echoing its own writes wake no reconcile, and how a refused creation is retried
(backoff, one event, the successes of the same pass kept)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from support.jobs import valid_job

from kubetrain.api.models import TrainingJob
from kubetrain.operator import archive_io, podgroup
from kubetrain.operator import controller as controller_module
from kubetrain.operator.controller import LAST_APPLIED, Controller, JobState
from kubetrain.operator.kube import ApiError, Refused
from kubetrain.operator.pods import PodView
from kubetrain.operator.refusal import BLOCKED
from kubetrain.operator.render import render_pod
from kubetrain.operator.settings import OperatorSettings, RenderSettings

pytestmark = pytest.mark.unit

KEY = ("ns", "j")
NO_SA = 'pods "j-node-{}" is forbidden: error looking up service account ns/trainer: serviceaccount "trainer" not found'
QUOTA = 'pods "j-node-1" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=1, limited: pods=1'


class FakeKube:
    """Records every write; `refuse` maps an object's name to the error its creation raises."""

    def __init__(self) -> None:
        self.refuse: dict[str, Exception] = {}
        self.created: list[str] = []
        self.statuses: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        self.version = 1
        self.returns_managed_fields = False
        self.bodies: dict[str, dict[str, Any]] = {}  # what was created, by name
        self.gate = asyncio.Event()  # creates answer once it is set
        self.gate.set()
        self.served: set[str] = set()  # the PodGroup API versions discovery finds
        self.discoveries = 0
        self.deleted_collections: list[str] = []
        self.lists: list[str] = []  # label selectors of the pod lists
        self.vanished: set[str] = set()  # created pods a list no longer returns
        self.deleted: list[str] = []
        self.graces: list[int | None] = []
        self.calls: list[str] = []  # log streams opened and pods deleted, in order
        self.streams_open = True  # False: a stream's headers never come
        self.secrets: list[tuple[str, int]] = []
        self.patches: list[tuple[str, str, Any]] = []

    async def serves(self, api_version: str, plural: str) -> bool:
        self.discoveries += 1
        await asyncio.sleep(0)  # a real request yields to the other reconciles
        return api_version in self.served

    async def delete_collection(self, api_version: str, namespace: str, plural: str, selector: str) -> None:
        self.deleted_collections.append(f"{plural}?{selector}")

    async def merge_patch(self, api_version: str, namespace: str, plural: str, name: str, patch: Any) -> None:
        self.patches.append((api_version, name, patch))

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        if name in self.refuse:
            raise self.refuse[name]
        if obj["kind"] == "Secret":  # the in-place job's agent token: (name, children created before it)
            self.secrets.append((name, len(self.created)))
            return self.answer(obj)
        self.created.append(name)
        self.bodies[name] = obj
        await self.gate.wait()
        return self.answer(obj)

    async def replace_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.statuses.append(status)
        meta = {**body["metadata"], "resourceVersion": str(self.version)}
        if self.returns_managed_fields:
            meta["managedFields"] = [{"manager": "kubetrain-operator", "subresource": "status"}]
        return {**body, "metadata": meta, "status": status}

    async def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason))

    async def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None) -> None:
        self.deleted.append(name)
        self.graces.append(grace_seconds)
        self.calls.append(f"delete {name}")

    async def stream_log(
        self, namespace: str, pod: str, tail_lines: int, opened: asyncio.Event | None = None
    ) -> AsyncIterator[bytes]:
        """A log followed until the container exits, which it never does here."""
        self.calls.append(f"follow {pod}")
        if self.streams_open and opened is not None:
            opened.set()
        await asyncio.Event().wait()
        yield b""

    async def list(self, path: str, query: dict[str, str]) -> dict[str, Any]:
        """The pods created and not `vanished`, as the API server would list them."""
        self.lists.append(query["labelSelector"])
        pods = [self.answer(b) for n, b in self.bodies.items() if b["kind"] == "Pod" and n not in self.vanished]
        return {"items": pods}

    @staticmethod
    def answer(obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        return {
            **obj,
            "metadata": {**obj["metadata"], "uid": f"uid-{name}", "creationTimestamp": "2026-01-01T12:00:00Z"},
        }


def make(**spec: Any) -> tuple[Controller, FakeKube]:
    kube = FakeKube()
    controller = Controller(OperatorSettings(), kube)  # type: ignore[arg-type]
    body = valid_job("j", **spec)
    body["metadata"].update(namespace="ns", uid="job-uid", resourceVersion="1", generation=1)
    # As job_seen would, without its queue: the tests drive the reconciles themselves.
    controller.jobs[KEY] = JobState(body)
    return controller, kube


def reconcile(controller: Controller) -> float | None:
    return asyncio.run(controller.reconcile(KEY))


def blocked(kube: FakeKube) -> tuple[str, str] | None:
    conditions = kube.statuses[-1].get("conditions") or []
    c = next((c for c in conditions if c["type"] == BLOCKED), None)
    return None if c is None else (c["status"], c["reason"])


def test_a_new_job_is_one_status_write_after_its_children() -> None:
    controller, kube = make()
    reconcile(controller)
    assert kube.created == ["j", "j-node-0", "j-node-1"] and len(kube.statuses) == 1
    # The agents' token (runPolicy.restartStrategy InPlace, the default) exists before any pod reads it.
    assert kube.secrets == [("j-kubetrain-agent", 0)]
    assert kube.events == [("Normal", "Created")]
    # Before any watch event arrived: the expectations hold the two pods and the Service.
    reconcile(controller)
    assert kube.created == ["j", "j-node-0", "j-node-1"] and len(kube.statuses) == 1
    # The agents' token (runPolicy.restartStrategy InPlace, the default) exists before any pod reads it.
    assert kube.secrets == [("j-kubetrain-agent", 0)]


def test_the_watches_echoing_what_the_controller_wrote_wake_no_reconcile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new job's watches show its pods, its Service and its status write just as the
    controller made them: none is news (a reconcile would decide the same), so none wakes
    one; a change it did not make does."""
    controller, kube = make()
    reconcile(controller)
    state = controller.jobs[KEY]
    woken: list[tuple[str, str]] = []
    monkeypatch.setattr(controller.queue, "add", lambda key, delay=0.0: woken.append(key))
    views = {name: PodView.from_pod(kube.answer(kube.bodies[name])) for name in ("j-node-0", "j-node-1")}
    for view in views.values():
        controller.pod_changed(KEY, view.uid, view)
    controller.service_changed(KEY, "uid-j", "j")
    controller.job_seen(json.loads(json.dumps(state.body)))  # the echo of the status write
    assert woken == [] and state.expectations.creations == {}
    controller.pod_changed(KEY, "uid-j-node-0", dataclasses.replace(views["j-node-0"], phase="Running"))
    controller.service_changed(KEY, "uid-j", None)
    edited = json.loads(json.dumps(state.body))
    edited["metadata"]["resourceVersion"] = "3"
    controller.job_seen(edited)
    assert woken == [KEY, KEY, KEY]
    assert state.body["metadata"]["resourceVersion"] == "3"


@pytest.mark.parametrize("still_there", [True, False])
def test_a_created_pod_the_watch_never_showed_is_asked_for_not_presumed_deleted(
    monkeypatch: pytest.MonkeyPatch, still_there: bool
) -> None:
    """Under load a watch can lag past the expectations' timeout: the controller lists the
    job's pods instead of taking a lagging pod for a deleted one (which restarts the gang)."""
    controller, kube = make()
    reconcile(controller)
    monkeypatch.setattr(controller_module, "EXPECTATIONS_TIMEOUT_SECONDS", -1.0)
    if not still_there:
        kube.vanished = {"j-node-1"}
    reconcile(controller)
    assert kube.lists == ["kubetrain.dev/job-uid=job-uid"]
    if still_there:  # the watch is late, not the pod: nothing recreated or restarted
        assert kube.created == ["j", "j-node-0", "j-node-1"]
        assert sorted(controller.jobs[KEY].expectations.creations) == ["uid-j-node-0", "uid-j-node-1"]
        assert len(kube.statuses) == 1 and kube.deleted == []
    else:  # really gone: the gang restarts
        assert kube.deleted == ["j-node-0"] and kube.statuses[-1]["failures"][0]["reason"] == "PodDeleted"


def test_the_held_job_drops_managed_fields_and_the_last_applied_copy() -> None:
    """Per job the controller keeps what the reconcile and the status write read, also after
    the status write returned the object with the server's bookkeeping."""
    controller, kube = make()
    manifest = json.dumps(controller.jobs[KEY].body)
    body = controller.jobs.pop(KEY).body
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {}}]
    body["metadata"]["annotations"] = {LAST_APPLIED: manifest, "team": "vision"}
    kube.returns_managed_fields = True

    async def seen_and_reconciled() -> None:
        controller.lead()
        controller.job_seen(body)
        await asyncio.gather(*controller.queue.tasks)

    asyncio.run(seen_and_reconciled())
    held = controller.jobs[KEY].body["metadata"]
    assert len(kube.statuses) == 1 and held["resourceVersion"] == "2"
    assert "managedFields" not in held and held["annotations"] == {"team": "vision"}
    assert LAST_APPLIED in body["metadata"]["annotations"]  # the watch's object is not mutated


def jobs_in(phase: str) -> float:
    return REGISTRY.get_sample_value("kubetrain_trainingjobs", {"phase": phase}) or 0.0


def test_the_jobs_by_phase_gauge_follows_the_job_until_it_is_deleted() -> None:
    controller, kube = make()
    pending, failed = jobs_in("Pending"), jobs_in("Failed")
    reconcile(controller)
    assert jobs_in("Pending") == pending + 1
    kube.refuse = {"j-node-0": Refused(422, 'Pod "j-node-0" is invalid: spec.tolerations[0].key: Invalid value')}
    controller.jobs[KEY].expectations.creations.clear()
    controller.jobs[KEY].expectations.service = False
    reconcile(controller)
    assert (jobs_in("Pending"), jobs_in("Failed")) == (pending, failed + 1)
    controller.job_deleted(KEY)
    assert (jobs_in("Pending"), jobs_in("Failed")) == (pending, failed)


def test_at_most_workers_jobs_create_at_once_in_the_order_they_came() -> None:
    kube = FakeKube()
    controller = Controller(OperatorSettings(workers=2), kube)  # type: ignore[arg-type]
    for name in "abcde":
        body = valid_job(name)
        body["metadata"].update(namespace="ns", uid=f"uid-{name}", resourceVersion="1")
        controller.jobs[("ns", name)] = JobState(body)

    async def scenario() -> None:
        kube.gate.clear()
        runs = [asyncio.create_task(controller.reconcile(("ns", name))) for name in "abcde"]
        for _ in range(20):  # yield to the loop: every task had its turns (no clock involved)
            await asyncio.sleep(0)
        assert sorted(kube.created) == ["a", "a-node-0", "a-node-1", "b", "b-node-0", "b-node-1"]
        kube.gate.set()
        await asyncio.gather(*runs)

    asyncio.run(scenario())
    assert [name for name in kube.created if "-" not in name] == list("abcde")


def test_a_transient_refusal_backs_off_and_recovers() -> None:
    controller, kube = make(serviceAccountName="trainer")
    kube.refuse = {f"j-node-{r}": Refused(403, NO_SA.format(r)) for r in (0, 1)}
    delays = [reconcile(controller) for _ in range(8)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60]
    assert kube.created == ["j"] and blocked(kube) == ("True", "ServiceAccountNotFound")
    assert len(kube.statuses) == 1 and kube.events == [("Warning", BLOCKED)]  # not one per retry
    kube.refuse = {}
    assert reconcile(controller) is None  # nothing due: the pods' watch events wake it
    assert kube.created == ["j", "j-node-0", "j-node-1"] and blocked(kube) == ("False", "Admitted")
    assert kube.events[1:] == [("Normal", "Created")]
    kube.refuse = {"j-node-0": Refused(403, NO_SA.format(0))}
    controller.jobs[KEY].expectations.creations.clear()
    controller.jobs[KEY].expectations.service = False
    assert reconcile(controller) == 1  # the backoff starts again after a success


def test_the_admitted_pods_of_a_partly_refused_pass_are_kept() -> None:
    controller, kube = make()
    kube.refuse = {"j-node-1": Refused(403, QUOTA)}
    reconcile(controller)
    assert kube.created == ["j", "j-node-0"] and blocked(kube) == ("True", "QuotaExceeded")
    kube.refuse = {}
    reconcile(controller)
    assert kube.created == ["j", "j-node-0", "j-node-1"]  # rank 0 is expected, not created again


def test_an_invalid_pod_fails_the_job_and_is_not_retried() -> None:
    controller, kube = make()
    kube.refuse = {"j-node-0": Refused(422, 'Pod "j-node-0" is invalid: spec.tolerations[0].key: Invalid value')}
    assert reconcile(controller) is None
    status = kube.statuses[-1]
    assert status["phase"] == "Failed" and kube.events == [("Warning", "PodCreationFailed")]


def test_a_server_error_is_raised_for_the_work_queue_after_the_successes_are_expected() -> None:
    controller, kube = make()
    kube.refuse = {"j-node-1": ApiError(500, b'{"message": "etcdserver: request timed out"}')}
    with pytest.raises(ApiError):
        reconcile(controller)
    assert kube.statuses == [] and list(controller.jobs[KEY].expectations.creations) == ["uid-j-node-0"]


def pod(controller: Controller, rank: int, phase: str, exit_code: int) -> PodView:
    """Node `rank`'s pod of attempt 0 as the index holds it once its container exited."""
    job = TrainingJob.model_validate(controller.jobs[KEY].body)
    body = render_pod(job, "ns", "job-uid", rank, 0, RenderSettings())
    body["metadata"].update(uid=f"uid-{rank}", creationTimestamp="2026-01-01T12:00:00Z")
    terminated = {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed", "message": ""}
    body["status"] = {"phase": phase, "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]}
    return PodView.from_pod(body)


def running(controller: Controller, rank: int) -> PodView:
    """Node `rank`'s pod of attempt 0, its trainer running."""
    job = TrainingJob.model_validate(controller.jobs[KEY].body)
    body = render_pod(job, "ns", "job-uid", rank, 0, RenderSettings())
    body["metadata"].update(uid=f"uid-{rank}", creationTimestamp="2026-01-01T12:00:00Z")
    state = {"running": {"startedAt": "2026-01-01T12:00:05Z"}}
    body["status"] = {"phase": "Running", "containerStatuses": [{"name": "trainer", "state": state, "ready": True}]}
    return PodView.from_pod(body)


@pytest.mark.parametrize("streams_open", [True, False])
def test_the_pods_a_suspend_deletes_have_their_logs_followed_first(
    monkeypatch: pytest.MonkeyPatch, streams_open: bool
) -> None:
    """A trainer that exits at once on SIGTERM has its log removed with its container: each pod's
    log stream is open before its delete is asked for. A stream that does not open in time
    (the kubelet answers with the first bytes) holds the delete back only that long."""
    monkeypatch.setattr(archive_io, "CAPTURE_OPEN_SECONDS", 0.2)
    controller, kube = make(runPolicy={"suspend": True})
    kube.streams_open = streams_open
    controller.jobs[KEY].body["status"] = {"attempt": 0, "replicas": {"active": 2, "ready": 2}}
    controller.pods = {KEY: [running(controller, 0), running(controller, 1)]}
    controller.services = {KEY: ["j"]}
    reconcile(controller)
    assert sorted(kube.calls[:2]) == ["follow j-node-0", "follow j-node-1"], kube.calls
    assert sorted(kube.calls[2:]) == ["delete j-node-0", "delete j-node-1"], kube.calls
    assert kube.statuses[-1]["phase"] == "Suspended"
    reconcile(controller)  # the deletes are expected: neither followed nor asked for again
    assert len(kube.calls) == 4, kube.calls


def finished(reason: str) -> float:
    return REGISTRY.get_sample_value("kubetrain_trainingjobs_finished_total", {"reason": reason}) or 0.0


def record(event: str, **fields: Any) -> str:
    return json.dumps({"event": event, "time": 1.8e9, "epoch": 1, "total_steps": 100, **fields})


def test_a_crash_at_teardown_after_done_is_read_before_restarting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 aborts at teardown after rank 0 wrote its final checkpoint and `done`, after the last
    periodic read: the controller reads rank 0's log before acting on the failure, and the
    late-crash rule finishes the job instead of restarting the gang."""
    before = finished("CompletedBeforeFailure")
    controller, kube = make()
    running = {"attempt": 0, "replicas": {"active": 2, "ready": 2}, "progress": {"step": 90, "totalSteps": 100}}
    controller.jobs[KEY].body["status"] = running
    controller.pods = {KEY: [pod(controller, 0, "Succeeded", 0), pod(controller, 1, "Failed", 134)]}
    controller.services = {KEY: ["j"]}
    reads: list[str] = []

    async def logs(namespace: str, name: str) -> str:
        reads.append(name)
        return "\n".join([record("checkpoint", step=100, path="/ckpt/step-100"), record("done", step=100)])

    controller.logs.source = logs
    reconcile(controller)
    assert reads == ["j-node-0"]
    status = kube.statuses[-1]
    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert succeeded["reason"] == "CompletedBeforeFailure"
    assert "rank 0 recorded done at step 100" in succeeded["message"]
    assert status["attempt"] == 0 and status["restarts"] == 0 and "failures" not in status
    assert ("Normal", "CompletedBeforeFailure") in kube.events and ("Warning", "GangRestart") not in kube.events
    assert finished("CompletedBeforeFailure") == before + 1


def test_a_refused_checkpoint_is_one_warning_event_however_often_rank_0s_log_is_read() -> None:
    """The holder's rank 0 reports a stale attempt's refused commit once; the operator reads that
    log every progress interval and posts the Event only with the status that first holds it."""
    controller, kube = make(checkpoint={"objectStore": {"url": "s3://bucket/runs/a"}})
    controller.jobs[KEY].body["status"] = {"attempt": 0, "replicas": {"active": 2, "ready": 2}}
    controller.pods = {KEY: [running(controller, 0), running(controller, 1)]}
    controller.services = {KEY: ["j"]}
    refusal = record(
        "checkpoint_refused", step=40, path="s3://bucket/runs/a/step-40", refused_attempt=0, current_attempt=1
    )

    async def logs(namespace: str, name: str) -> str:
        return "\n".join([record("step", step=50), refusal])

    controller.logs.source = logs
    for _ in range(3):
        controller.jobs[KEY].reads.progress_at = None  # the interval passed: read again
        reconcile(controller)
    assert kube.events.count(("Warning", "CheckpointRefused")) == 1, kube.events
    assert kube.statuses[-1]["lastCheckpointRefusal"] == {
        "attempt": 0,
        "currentAttempt": 1,
        "step": 40,
        "path": "s3://bucket/runs/a/step-40",
        "time": "2027-01-15T08:00:00Z",
    }
    assert kube.statuses[-1]["progress"]["step"] == 50, "the refusal's step is not the job's progress"


def test_a_runtime_fallback_is_kept_in_status_and_is_one_warning_event() -> None:
    """node 0's torchrun agent, on a torch without a private name the in-place restart needs,
    prints a `fallback` record (kubetrain.runtime.torch_private) beside rank 0's records; the
    operator keeps one entry per feature in status.runtimeFallbacks and posts it once."""
    controller, kube = make()
    controller.jobs[KEY].body["status"] = {"attempt": 0, "replicas": {"active": 2, "ready": 2}}
    controller.pods = {KEY: [running(controller, 0), running(controller, 1)]}
    controller.services = {KEY: ["j"]}
    message = (
        "torch 2.9.1 has no LocalElasticAgent._start_workers(worker_group): instead of in-place gang restarts, "
        "torchrun's own restart: a failure recreates the gang"
    )
    fallback = json.dumps(
        {
            "event": "fallback",
            "time": 1.8e9,
            "feature": "in-place-restart",
            "torch": "2.9.1",
            "missing": ["LocalElasticAgent._start_workers(worker_group)"],
            "message": message,
        }
    )

    async def logs(namespace: str, name: str) -> str:
        return "\n".join([fallback, fallback, record("step", step=50)])

    controller.logs.source = logs
    for _ in range(3):
        controller.jobs[KEY].reads.progress_at = None  # the interval passed: read again
        reconcile(controller)
    assert kube.events.count(("Warning", "RuntimeFallback")) == 1, kube.events
    assert kube.statuses[-1]["runtimeFallbacks"] == [
        {"feature": "in-place-restart", "torch": "2.9.1", "message": message, "time": "2027-01-15T08:00:00Z"}
    ]
    assert kube.statuses[-1]["progress"]["step"] == 50


def test_a_fail_job_rule_is_counted_as_finished_by_its_reason() -> None:
    rule = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}}
    controller, kube = make(runPolicy={"maxRestarts": 3, "failurePolicy": {"rules": [rule]}})
    controller.jobs[KEY].body["status"] = {"attempt": 0, "replicas": {"active": 2, "ready": 2}}
    controller.pods = {KEY: [pod(controller, 0, "Failed", 2), pod(controller, 1, "Failed", 2)]}
    controller.services = {KEY: ["j"]}
    before = finished("FailurePolicy")

    async def no_records(namespace: str, name: str) -> str:
        return "a log line without metrics records"

    controller.logs.source = no_records
    reconcile(controller)
    assert kube.statuses[-1]["phase"] == "Failed" and ("Warning", "FailurePolicy") in kube.events
    assert finished("FailurePolicy") == before + 1


def test_a_native_gang_creates_its_podgroup_before_the_pods_that_join_it() -> None:
    controller, kube = make()
    kube.served = {"scheduling.k8s.io/v1alpha2"}
    reconcile(controller)
    assert kube.created == ["j-0", "j", "j-node-0", "j-node-1"]
    assert kube.deleted_collections == ["podgroups?kubetrain.dev/job-uid=job-uid,kubetrain.dev/attempt!=0"]
    pods = [kube.bodies[name] for name in ("j-node-0", "j-node-1")]
    assert [pod["spec"]["schedulingGroup"] for pod in pods] == [{"podGroupName": "j-0"}] * 2
    assert kube.events == [("Normal", "GangScheduling"), ("Normal", "Created")]


def test_on_kubernetes_1_37_the_podgroup_is_written_as_v1beta1() -> None:
    controller, kube = make()
    kube.served = {"scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha3"}
    reconcile(controller)
    group = kube.bodies["j-0"]
    assert (group["apiVersion"], group["spec"]["disruptionMode"]) == ("scheduling.k8s.io/v1beta1", {"all": {}})
    assert kube.bodies["j-node-0"]["spec"]["schedulingGroup"] == {"podGroupName": "j-0"}


ELASTIC_JOB = {"elastic": {"minNodes": 2}, "nodes": 3, "command": ["python", "train.py"]}


@pytest.mark.parametrize(
    ("served", "patched"), [("scheduling.k8s.io/v1beta1", True), ("scheduling.k8s.io/v1alpha2", False)]
)
def test_an_elastic_jobs_podgroup_follows_its_min_nodes_where_the_version_allows(served: str, patched: bool) -> None:
    controller, kube = make(**ELASTIC_JOB)
    kube.served = {served}
    reconcile(controller)
    assert kube.created == ["j-elastic", "j", "j-node-0", "j-node-1"], "the quorum's pods first"
    assert kube.bodies["j-elastic"]["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    assert kube.deleted_collections == [], "one PodGroup for the job's life: no sweep of other attempts'"
    # Once after the operator starts (the group may predate it), where minCount may change.
    expected = [(served, "j-elastic", {"spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}})]
    assert kube.patches == (expected if patched else [])
    state = controller.jobs[KEY]
    state.body = {**state.body, "spec": {**state.body["spec"], "elastic": {"minNodes": 1}}}
    reconcile(controller)
    reconcile(controller)  # the same minimum again: no second write
    lowered = (served, "j-elastic", {"spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}})
    assert kube.patches == ([*expected, lowered] if patched else [])


def test_a_refused_podgroup_creates_no_pod_of_the_gang() -> None:
    controller, kube = make()
    kube.served = {"scheduling.k8s.io/v1alpha2"}
    forbidden = 'podgroups.scheduling.k8s.io is forbidden: User "op" cannot create resource "podgroups"'
    kube.refuse = {"j-0": Refused(403, forbidden)}
    assert reconcile(controller) == 1
    assert kube.created == [] and blocked(kube) == ("True", "OperatorForbidden")


def test_discovery_is_asked_once_for_a_burst_of_jobs() -> None:
    controller, kube = make()
    for name in ("k", "l"):
        body = valid_job(name)
        body["metadata"].update(namespace="ns", uid=f"{name}-uid", resourceVersion="1", generation=1)
        controller.jobs[("ns", name)] = JobState(body)

    async def burst() -> None:
        await asyncio.gather(*(controller.reconcile(key) for key in list(controller.jobs)))

    asyncio.run(burst())
    assert kube.discoveries == len(podgroup.ALL_APIS) and len(kube.statuses) == 3  # one per PodGroup API


def test_a_coscheduling_gang_labels_its_pods_with_the_scheduler_plugins_podgroup() -> None:
    controller, kube = make(scheduling={"gang": "coscheduling"}, schedulerName="scheduler-plugins-scheduler")
    kube.served = {"scheduling.x-k8s.io/v1alpha1"}
    reconcile(controller)
    assert kube.created == ["j-0", "j", "j-node-0", "j-node-1"]
    pods = [kube.bodies[name] for name in ("j-node-0", "j-node-1")]
    assert [pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for pod in pods] == ["j-0"] * 2
    assert all("schedulingGroup" not in pod["spec"] for pod in pods)


class FakeKueue(FakeKube):
    """FakeKube plus Kueue's objects: `objects` maps (plural, name) to what a GET returns."""

    def __init__(self) -> None:
        super().__init__()
        self.objects: dict[tuple[str, str], dict[str, Any] | Exception] = {}
        self.pods: dict[str, dict[str, Any]] = {}

    async def get_kueue(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        found = self.objects.get((plural, name))
        if isinstance(found, Exception):
            raise found
        return found

    async def create_workload(self, workload: dict[str, Any]) -> None:
        self.created.append(workload["metadata"]["name"])
        self.objects[("workloads", workload["metadata"]["name"])] = workload

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.pods[obj["metadata"]["name"]] = obj
        return await super().create(obj)


def test_a_queued_job_waits_for_its_workload_and_starts_only_on_a_readable_flavor() -> None:
    controller, _ = make()
    kube = FakeKueue()
    controller.kube = kube  # type: ignore[assignment]
    controller.jobs[KEY].body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
    reconcile(controller)
    assert kube.created == ["trainingjob-j"] and kube.statuses[-1]["phase"] == "Suspended"
    workload = kube.objects[("workloads", "trainingjob-j")]
    assert isinstance(workload, dict)
    admitted = {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""}
    assignment = {"name": "nodes", "flavors": {"cpu": "pool-a"}}
    workload["status"] = {"conditions": [admitted], "admission": {"podSetAssignments": [assignment]}}
    kube.objects[("resourceflavors", "pool-a")] = ApiError(403, b'{"message": "cannot get resourceflavors"}')
    assert reconcile(controller) == 1  # retried with backoff, nothing started off its flavor
    assert kube.created == ["trainingjob-j"] and blocked(kube) == ("True", "ResourceFlavorUnreadable")
    kube.objects[("resourceflavors", "pool-a")] = {"spec": {"nodeLabels": {"pool": "a"}}}
    reconcile(controller)
    assert kube.created == ["trainingjob-j", "j", "j-node-0", "j-node-1"]
    assert [kube.pods[f"j-node-{r}"]["spec"]["nodeSelector"] for r in (0, 1)] == [{"pool": "a"}] * 2
