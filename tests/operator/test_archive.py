"""The log archive, the pure half (operator/archive.py): which pods are due, the tail cut, the
ConfigMap and the patches; and the controller applying it against a recording fake of kube.py:
the archive is written before the status, the finalizer comes off after it, and a pass that
died in between is redone without losing what was kept."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.jobs import valid_job

from kubetrain.api import naming
from kubetrain.api.models import LastCheckpoint, TrainingJob, TrainingJobStatus
from kubetrain.api.records import fold_checkpoints
from kubetrain.operator import archive, archive_io
from kubetrain.operator.archive import NODE_BYTES, RELEASE_MARGIN_SECONDS, cut, node_budget
from kubetrain.operator.controller import Controller, JobState
from kubetrain.operator.kube import ApiError, Refused
from kubetrain.operator.pods import PodView
from kubetrain.operator.progress import fold_checkpoints as fold_into_status
from kubetrain.operator.settings import OperatorSettings

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
FINALIZER = naming.LOG_FINALIZER


def view(
    rank: int = 1,
    *,
    attempt: int = 0,
    job_uid: str = "job-uid",
    finalizers: tuple[str, ...] = (FINALIZER,),
    deleted: float | None = 3.0,  # seconds from NOW to the end of the grace period; None: not deleted
    grace: int | None = 3,
    started: bool = True,
    exit_code: int | None = None,
    phase: str = "Running",
    scheduled: bool = True,
) -> PodView:
    return PodView(
        name=f"j-node-{rank}",
        uid=f"uid-{attempt}-{rank}",
        job_uid=job_uid,
        rank=rank,
        attempt=attempt,
        phase=phase,
        terminating=deleted is not None,
        created=NOW - timedelta(minutes=5),
        node="node-a" if scheduled else None,
        scheduled=scheduled,
        exit_code=exit_code,
        has_run=started,
        deleted_at=None if deleted is None else NOW + timedelta(seconds=deleted),
        deletion_grace=None if deleted is None else grace,
        finalizers=finalizers,
    )


@pytest.mark.parametrize(
    ("pod", "job_uid", "due"),
    [
        (view(finalizers=()), "job-uid", None),  # not ours to hold
        (view(deleted=None), "job-uid", None),  # not deleted: its log is still there
        (view(deleted=None), None, "release"),  # its job is gone: nothing to keep
        (view(), None, "release"),
        (view(job_uid="old-uid"), "job-uid", "release"),  # a deleted job's of the same name
        # Deleted: a terminated container's tail is kept now, whatever the grace left.
        (view(exit_code=1, phase="Failed"), "job-uid", "archive"),
        (view(exit_code=0, phase="Succeeded"), "job-uid", "archive"),
        (view(phase="Failed"), "job-uid", "archive"),  # evicted: a terminal phase, no exit code
        # Still stopping (SIGTERM, the trainer checkpoints): its log is followed meanwhile.
        (view(), "job-uid", "capture"),
        (view(deleted=-RELEASE_MARGIN_SECONDS + 1), "job-uid", "capture"),
        # The kubelet's own final delete (grace 0), or a lost node past the margin: keep what is there.
        (view(grace=0, deleted=0), "job-uid", "archive"),
        (view(deleted=-RELEASE_MARGIN_SECONDS), "job-uid", "archive"),
        # Never started: no log. Unscheduled it never will; scheduled, the kubelet has its say first.
        (view(started=False, scheduled=False, phase="Pending"), "job-uid", "release"),
        (view(started=False, phase="Pending"), "job-uid", "wait"),
        (view(started=False, phase="Pending", grace=0, deleted=0), "job-uid", "release"),
    ],
)
def test_which_pods_are_due(pod: PodView, job_uid: str | None, due: str | None) -> None:
    plan = archive.plan([pod], job_uid, NOW)
    found = {name for name in ("archive", "capture", "release") if pod in getattr(plan, name)}
    if due == "wait":
        assert found == set() and plan.look_again == pytest.approx(3 + RELEASE_MARGIN_SECONDS)
    else:
        assert found == ({due} if due else set())
    if due == "capture":
        assert plan.look_again == pytest.approx((pod.deleted_at - NOW).total_seconds() + RELEASE_MARGIN_SECONDS)  # type: ignore[operator]


def test_pods_nobody_deletes_are_a_fixed_point() -> None:
    """A running gang: nothing is read, written or released, pass after pass."""
    assert archive.plan([view(r, deleted=None) for r in range(4)], "job-uid", NOW) == archive.Plan()


@pytest.mark.parametrize(("nodes", "budget"), [(1, NODE_BYTES), (14, NODE_BYTES), (15, 61440), (1024, 900)])
def test_each_node_keeps_its_share_of_one_configmap(nodes: int, budget: int) -> None:
    assert node_budget(nodes) == budget
    assert nodes * node_budget(nodes) <= archive.ARCHIVE_BYTES < 1024 * 1024


LINES = "".join(f"line {i:03d}\n" for i in range(100))  # 9 bytes a line
MARKER = len(archive.cut_marker(900).encode())  # the marker line for a 3-digit count


@pytest.mark.parametrize(
    ("text", "budget"),
    [
        ("short\n", 100),
        (LINES, len(LINES)),
        *((LINES, MARKER + 9 * 3 + extra) for extra in range(10)),  # every offset within a line
        (LINES, MARKER + 9 * 50),
        ("é" * 200 + "\n", MARKER + 11),  # one line longer than the budget
        ("é" * 200, MARKER + 10),
    ],
)
def test_the_tail_is_cut_at_a_line_boundary_and_says_so(text: str, budget: int) -> None:
    result = cut(text, budget)
    assert len(result.encode()) <= budget
    if len(text.encode()) <= budget:
        assert result == text
        return
    marker, body = result.split("\n", 1)
    assert text.endswith(body) and body
    dropped = len(text.encode()) - len(body.encode())
    assert marker + "\n" == archive.cut_marker(dropped)
    room = budget - len(archive.cut_marker(dropped).encode())
    if "\n" in text[:-1]:
        # Whole lines, as many as fit.
        assert text[: len(text) - len(body)].endswith("\n")
        longer = text[: len(text) - len(body) - 1].rpartition("\n")[2] + "\n" + body
        assert len(longer.encode()) > room
    else:
        assert len(body.encode()) > room - 2  # a character's bytes at most short of the room


def test_a_cut_log_keeps_the_end_of_a_traceback() -> None:
    log = "".join(f"step {i}\n" for i in range(20000)) + "Traceback (most recent call last):\nValueError: boom\n"
    kept = cut(log, node_budget(2))
    assert kept.endswith("ValueError: boom\n") and len(kept.encode()) <= node_budget(2)
    assert kept.splitlines()[1].startswith("step ")  # whole lines after the marker


def job() -> TrainingJob:
    body = valid_job("j", nodes=2)
    body["metadata"].update(namespace="ns", uid="job-uid")
    return TrainingJob.model_validate(body)


def test_the_configmap_and_its_patches() -> None:
    data = archive.entries({1: "boom\n", 0: "ok\n"}, 2)
    assert data == {"node-0.log": "ok\n", "node-1.log": "boom\n"}
    assert archive.configmap(job(), "ns", "job-uid", 3, data) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "j-attempt-3-logs",
            "namespace": "ns",
            "labels": {
                "kubetrain.dev/job-name": "j",
                "kubetrain.dev/job-uid": "job-uid",
                "kubetrain.dev/attempt": "3",
                "app.kubernetes.io/managed-by": "kubetrain-operator",
                "kubetrain.dev/component": "logs",
            },
            "ownerReferences": [
                {
                    "apiVersion": "kubetrain.dev/v1alpha1",
                    "kind": "TrainingJob",
                    "name": "j",
                    "uid": "job-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {"node-0.log": "ok\n", "node-1.log": "boom\n"},
    }
    # Added to only if it is this job's archive (the label test fails otherwise).
    assert archive.update("job-uid", {"node-1.log": "boom\n"}) == [
        {"op": "test", "path": "/metadata/labels/kubetrain.dev~1job-uid", "value": "job-uid"},
        {"op": "add", "path": "/data/node-1.log", "value": "boom\n"},
    ]


def test_the_release_removes_only_kubetrains_finalizer_at_its_index() -> None:
    pod = view(finalizers=("example.com/keep", FINALIZER, "example.com/other"))
    assert archive.release(pod) == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]
    assert archive.release(view(finalizers=("example.com/keep",))) is None


@pytest.mark.parametrize(
    ("job_name", "attempt", "name"),
    [
        ("j", 0, "j-attempt-0-logs"),
        ("a" * naming.MAX_JOB_NAME, 10**9, "a" * naming.MAX_JOB_NAME + "-attempt-1000000000-logs"),
    ],
)
def test_the_archive_name_is_a_valid_configmap_name(job_name: str, attempt: int, name: str) -> None:
    assert naming.log_archive_name(job_name, attempt) == name
    assert len(name) <= naming.MAX_DNS_SUBDOMAIN


@pytest.mark.parametrize(("key", "rank"), [("node-0.log", 0), ("node-12.log", 12), ("node-01.log", None), ("x", None)])
def test_archive_keys(key: str, rank: int | None) -> None:
    assert naming.log_archive_rank(key) == rank


def record(event: str, **fields: Any) -> str:
    return json.dumps({"event": event, "time": 1.8e9, **fields})


def test_only_checkpoint_records_of_an_archived_log_are_folded() -> None:
    """The checkpoint rank 0 wrote on SIGTERM after the last read; an old attempt's progress and
    an older checkpoint never move the job's status back."""
    log = "\n".join(
        [
            record("step", step=41, loss=0.5),
            record("checkpoint", step=41, path="/ck/step-41", reason="signal"),
            record("resume", step=10, path="/ck/step-10"),
        ]
    )
    assert fold_checkpoints(log, None) == LastCheckpoint(
        path="/ck/step-41", step=41, time=datetime.fromtimestamp(1.8e9, UTC), reason="signal"
    )
    newer = LastCheckpoint(path="/ck/step-50", step=50)
    assert fold_checkpoints(log, newer) is newer
    status = TrainingJobStatus.model_validate({"progress": {"step": 60}})
    folded = fold_into_status(status, log)
    assert folded.progress == status.progress and folded.last_checkpoint is not None
    assert folded.last_checkpoint.step == 41


# --- the controller, against a fake kube.py -----------------------------------------------------


class ArchiveKube:
    """What the archive needs of kube.py, recording the order of the writes."""

    def __init__(self, logs: dict[str, str]) -> None:
        self.logs = logs  # pod -> its log (a missing pod's read fails as the kubelet's would)
        self.writes: list[str] = []
        self.configmaps: dict[str, dict[str, Any]] = {}
        self.statuses: list[dict[str, Any]] = []
        self.fail_release = False

    async def serves(self, api_version: str, plural: str) -> bool:
        return False

    async def read_log(self, namespace: str, pod: str, tail_lines: int) -> str:
        if pod not in self.logs:
            raise ApiError(400, b'{"message": "container not found"}')
        return self.logs[pod]

    async def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        name = obj["metadata"]["name"]
        if obj["kind"] != "ConfigMap":
            self.writes.append(f"create {name}")
            return {"metadata": {**obj["metadata"], "uid": f"uid-{name}"}}
        if name in self.configmaps:
            return None
        self.writes.append(f"create configmap {name} {sorted(obj['data'])}")
        self.configmaps[name] = json.loads(json.dumps(obj))
        return {"metadata": obj["metadata"]}

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.configmaps.get(name)

    async def json_patch(self, namespace: str, plural: str, name: str, operations: list[dict[str, Any]]) -> bool:
        if plural == "configmaps":
            found = self.configmaps[name]
            assert operations[0]["value"] == found["metadata"]["labels"][naming.LABEL_JOB_UID]
            for op in operations[1:]:
                found["data"][op["path"].removeprefix("/data/")] = op["value"]
            self.writes.append(f"patch configmap {name} {[op['path'] for op in operations[1:]]}")
            return True
        if self.fail_release:
            raise Refused(403, "pods is forbidden")
        self.writes.append(f"release {name}")
        return True

    async def replace_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self.writes.append("status")
        self.statuses.append(status)
        return {**body, "metadata": {**body["metadata"], "resourceVersion": str(len(self.statuses) + 1)}}

    async def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str) -> None:
        pass

    async def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None) -> None:
        self.writes.append(f"delete {name}")


def restarting(kube: ArchiveKube) -> Controller:
    """A 2-node job in attempt 1 whose attempt 0 pods are being deleted: node 1 crashed, node 0
    checkpointed on SIGTERM and exited."""
    controller = Controller(OperatorSettings(), kube)  # type: ignore[arg-type]
    body = valid_job("j", nodes=2, runPolicy={"maxRestarts": 3})
    body["metadata"].update(namespace="ns", uid="job-uid", resourceVersion="1", generation=1)
    failure = {"attempt": 0, "rank": 1, "reason": "Error", "exitCode": 1, "message": "boom"}
    body["status"] = {"attempt": 1, "restarts": 1, "failures": [failure]}
    controller.jobs[("ns", "j")] = JobState(body)
    controller.pods = {
        ("ns", "j"): [
            view(0, exit_code=143, phase="Failed", deleted=100),
            view(1, exit_code=1, phase="Failed", deleted=1),
        ]
    }
    controller.services = {("ns", "j"): ["j"]}
    return controller


LOGS = {
    "j-node-0": record("checkpoint", step=41, path="/ck/step-41", reason="signal") + "\nexiting 143\n",
    "j-node-1": "Traceback (most recent call last):\nkubetrain.trainer.faults.InjectedFault: boom\n",
}
KEPT = {"node-0.log": LOGS["j-node-0"], "node-1.log": LOGS["j-node-1"]}


def test_a_restart_keeps_both_tails_records_the_signal_checkpoint_then_releases() -> None:
    kube = ArchiveKube(dict(LOGS))
    asyncio.run(restarting(kube).reconcile(("ns", "j")))
    assert kube.writes == [
        "create configmap j-attempt-0-logs ['node-0.log', 'node-1.log']",
        "status",
        "release j-node-0",
        "release j-node-1",
    ]
    assert kube.configmaps["j-attempt-0-logs"]["data"] == KEPT
    assert kube.statuses[-1]["lastCheckpoint"] == {
        "path": "/ck/step-41",
        "step": 41,
        "time": "2027-01-15T08:00:00Z",
        "reason": "signal",
    }


def test_an_operator_that_dies_before_the_release_redoes_it_and_keeps_what_it_kept() -> None:
    """The first pass kept the tails and died (here: the release refused); by the next pass the
    kubelet has removed node 1's container. The archive keeps the traceback."""
    kube = ArchiveKube(dict(LOGS))
    kube.fail_release = True
    controller = restarting(kube)
    with pytest.raises(Refused):
        asyncio.run(controller.reconcile(("ns", "j")))
    kube.fail_release = False
    del kube.logs["j-node-1"]
    fresh = restarting(kube)  # a new operator process: nothing in memory
    asyncio.run(fresh.reconcile(("ns", "j")))
    assert kube.configmaps["j-attempt-0-logs"]["data"] == KEPT
    assert kube.writes[-2:] == ["release j-node-0", "release j-node-1"]


def test_a_log_that_cannot_be_read_is_said_in_the_archive_and_the_pod_still_goes() -> None:
    kube = ArchiveKube({"j-node-0": "ok\n"})
    asyncio.run(restarting(kube).reconcile(("ns", "j")))
    kept = kube.configmaps["j-attempt-0-logs"]["data"]
    assert kept["node-0.log"] == "ok\n"
    assert kept["node-1.log"].startswith("[kubetrain: the log of pod j-node-1 could not be read when it was deleted")
    assert kube.writes[-2:] == ["release j-node-0", "release j-node-1"]


class StreamingKube(ArchiveKube):
    """As ArchiveKube, and pods/log?follow streams `streams[pod]` then ends (the container exited)."""

    def __init__(self, logs: dict[str, str], streams: dict[str, bytes]) -> None:
        super().__init__(logs)
        self.streams = streams

    async def stream_log(
        self, namespace: str, pod: str, tail_lines: int, opened: asyncio.Event | None = None
    ) -> AsyncIterator[bytes]:
        if opened is not None:
            opened.set()
        yield self.streams[pod]


GONE = b"unable to retrieve container logs for containerd://2dfbfdbbb8d6343290f607fe48ed2106d33\n"


@pytest.mark.parametrize(
    ("streamed", "kept"),
    [
        (LOGS["j-node-0"].encode(), LOGS["j-node-0"]),
        # Opened once the container was gone: the kubelet's notice is no log either.
        (GONE, "[kubetrain: the log of pod j-node-0 could not be read when it was deleted"),
    ],
)
def test_a_pod_followed_before_its_delete_keeps_what_was_followed(streamed: bytes, kept: str) -> None:
    """The operator followed node 0 before deleting it; by the read after its exit the kubelet has
    removed the container (the read fails): the followed log is what the archive keeps."""
    kube = StreamingKube({}, {"j-node-0": streamed})
    job = TrainingJob.model_validate(valid_job("j", nodes=2))

    async def scenario() -> dict[str, str]:
        captures = archive_io.Captures(kube)  # type: ignore[arg-type]
        await archive_io.follow_before_delete(captures, job, "ns", [view(0, deleted=None)])
        stopped = view(0, exit_code=143, phase="Failed")
        await archive_io.archive_logs(kube, captures, job, "ns", "job-uid", [stopped], NOW)  # type: ignore[arg-type]
        return dict(kube.configmaps["j-attempt-0-logs"]["data"])

    assert asyncio.run(scenario())["node-0.log"].startswith(kept)
