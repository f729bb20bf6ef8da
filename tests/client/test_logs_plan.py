"""`kubetrain logs`, the pure half: what a pod says about its log, and which pods to read."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from kubetrain.api import naming
from kubetrain.api.models import TrainingJobStatus
from kubetrain.client.logs import LogsError, NodePod, Plan, archive_of, ended_line, last_lines, missing, plan

pytestmark = pytest.mark.unit


def pod(
    rank: int,
    attempt: int = 0,
    *,
    phase: str = "Running",
    state: dict[str, Any] | None = None,
    scheduled: str | None = None,
    labels: bool = True,
) -> dict[str, Any]:
    """A pod as the API server returns it (camelCase JSON); `scheduled` is the message of a
    PodScheduled=False condition."""
    meta: dict[str, Any] = {"name": f"job-node-{rank}"}
    if labels:
        meta["labels"] = {"kubetrain.dev/node-rank": str(rank), "kubetrain.dev/attempt": str(attempt)}
    status: dict[str, Any] = {"phase": phase}
    if state is not None:
        status["containerStatuses"] = [{"name": "trainer", "state": state}]
    if scheduled is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "message": scheduled}]
    return {"metadata": meta, "status": status}


RUNNING = {"running": {"startedAt": "2026-11-23T07:00:00Z"}}
PULL = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}}
CREATING = {"waiting": {"reason": "ContainerCreating"}}
UNSCHEDULABLE = "0/1 nodes are available: 1 Insufficient cpu."
PULL_SAID = '[node-1] pod job-node-1: container trainer is waiting: ImagePullBackOff: Back-off pulling image "nope:1"'


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (pod(0, state=RUNNING), NodePod("job-node-0", 0, 0, "Running", True)),
        (
            pod(1, 2, phase="Succeeded", state={"terminated": {"exitCode": 0}}),
            NodePod("job-node-1", 1, 2, "Succeeded", True),
        ),
        (
            pod(1, phase="Pending", state=PULL),
            NodePod("job-node-1", 1, 0, "Pending", False, "ImagePullBackOff", 'Back-off pulling image "nope:1"'),
        ),
        (pod(0, phase="Pending", state=CREATING), NodePod("job-node-0", 0, 0, "Pending", False, "ContainerCreating")),
        (
            pod(1, phase="Pending", scheduled=UNSCHEDULABLE),
            NodePod("job-node-1", 1, 0, "Pending", False, None, UNSCHEDULABLE),
        ),
        (pod(0, labels=False), None),  # not a pod the operator made
    ],
)
def test_node_pod_from_the_api_object(doc: dict[str, Any], expected: NodePod | None) -> None:
    assert NodePod.from_pod(doc) == expected


@pytest.mark.parametrize(
    ("node", "says"),
    [
        (pod(1, phase="Pending", state=PULL), "[node-1] pod job-node-1: container trainer is waiting: ImagePull"),
        (pod(1, phase="Pending", scheduled=UNSCHEDULABLE), "[node-1] pod job-node-1: Pending, not started (not sch"),
        (pod(0, phase="Pending"), "[node-0] pod job-node-0: Pending, not started"),
        (pod(0, phase="Failed"), "[node-0] pod job-node-0: Failed, its container never started"),
    ],
)  # fmt: skip
def test_why_a_pod_has_no_log(node: dict[str, Any], says: str) -> None:
    found = NodePod.from_pod(node)
    assert found is not None and found.why_no_log().startswith(says), found.why_no_log()


def nodes(*docs: dict[str, Any]) -> list[NodePod]:
    return [p for p in map(NodePod.from_pod, docs) if p is not None]


RESTARTED = TrainingJobStatus.model_validate(
    {
        "phase": "Running",
        "attempt": 1,
        "restarts": 1,
        "failures": [{"attempt": 0, "rank": 1, "reason": "PodDeleted", "message": "pod job-node-1 was deleted"}],
    }
)
SUCCEEDED = TrainingJobStatus.model_validate(
    {
        "phase": "Succeeded",
        "attempt": 1,
        "conditions": [
            {"type": "Succeeded", "status": "True", "reason": "Done", "lastTransitionTime": "2026-11-23T07:00:00Z"}
        ],
    }
)
BOTH = nodes(pod(0, state=RUNNING), pod(1, state=RUNNING))
NEW_AND_OLD = nodes(pod(0, 1, state=RUNNING), pod(0, 0, phase="Failed", state={"terminated": {"exitCode": 1}}))
ARCHIVED = {0: "checkpoint\n", 1: "Traceback\n"}


@pytest.mark.parametrize(
    ("status", "pods", "options", "read", "archived", "problems"),
    [
        (TrainingJobStatus(), BOTH, {}, [0, 1], [], []),
        (TrainingJobStatus(), BOTH, {"rank": 1}, [1], [], []),
        # The current attempt only; a rank without a pod and without an archive is said.
        (RESTARTED, NEW_AND_OLD, {}, [0], [], ["[node-1] no pod and no archived log of attempt 1"]),
        # The previous attempt: a pod that still exists is read, the others from the archive.
        (RESTARTED, NEW_AND_OLD, {"previous": True, "archived": ARCHIVED}, [0], [1], []),
        (RESTARTED, NEW_AND_OLD, {"attempt": 0, "rank": 0}, [0], [], []),
        (RESTARTED, [], {"attempt": 0, "archived": ARCHIVED}, [], [0, 1], []),
        (
            RESTARTED,
            [],
            {"attempt": 0, "archived": {1: "x"}},
            [],
            [1],
            ["[node-0] no pod and no archived log of attempt 0"],
        ),
        # cleanPodPolicy All deleted the finished attempt's pods: its archive.
        (SUCCEEDED, [], {"archived": ARCHIVED, "rank": 1}, [], [1], []),
        # A pod that cannot start is said, the others still read.
        (
            TrainingJobStatus(),
            nodes(pod(0, state=RUNNING), pod(1, phase="Pending", state=PULL)),
            {},
            [0],
            [],
            [PULL_SAID],
        ),
        (TrainingJobStatus(), nodes(pod(1, phase="Pending", state=PULL)), {"rank": 1}, [], [], [PULL_SAID]),
    ],
)
def test_plan(
    status: TrainingJobStatus,
    pods: list[NodePod],
    options: dict[str, Any],
    read: list[int],
    archived: list[int],
    problems: list[str],
) -> None:
    got = plan("job", "team-a", status, 2, pods, **options)
    assert isinstance(got, Plan)
    assert ([p.rank for p in got.read], got.archived, got.problems) == (read, archived, problems)


@pytest.mark.parametrize(
    ("status", "pods", "options", "message"),
    [
        (
            TrainingJobStatus(),
            [],
            {},
            "trainingjob job in namespace team-a has no pods of attempt 0 yet (phase Pending)",
        ),
        (
            TrainingJobStatus(phase="Suspended", attempt=2),
            [],
            {},
            "trainingjob job in namespace team-a has no pods of attempt 2 yet (phase Suspended)",
        ),
        (TrainingJobStatus(), BOTH, {"rank": 2}, "--rank 2: trainingjob job has 2 nodes (ranks 0-1)"),
        (
            TrainingJobStatus(),
            BOTH,
            {"previous": True},
            "trainingjob job in namespace team-a has no failed attempt (it is in attempt 0)",
        ),
        (
            RESTARTED,
            BOTH,
            {"attempt": 2},
            "--attempt 2: trainingjob job in namespace team-a has attempts 0-1 (it is in attempt 1)",
        ),
        (RESTARTED, BOTH, {"attempt": 0, "previous": True}, "--previous-attempt and --attempt: give one of them"),
        (
            RESTARTED,
            nodes(pod(0, 1, state=RUNNING), pod(1, 1, state=RUNNING)),
            {"previous": True},
            "trainingjob job in namespace team-a: attempt 0 has no pods left and no archived log (ConfigMap "
            "job-attempt-0-logs); the operator recorded: PodDeleted on node 1: pod job-node-1 was deleted",
        ),
        (
            RESTARTED,
            [],
            {"attempt": 0, "rank": 0, "archived": {1: "x"}},
            "trainingjob job in namespace team-a: attempt 0 has no pods left and an archive without these nodes "
            "(ConfigMap job-attempt-0-logs); the operator recorded: PodDeleted on node 1: pod job-node-1 was deleted",
        ),
        (
            SUCCEEDED,
            [],
            {},
            "trainingjob job in namespace team-a: attempt 1 has no pods left and no archived log (ConfigMap "
            "job-attempt-1-logs)",
        ),
    ],
)
def test_nothing_to_read_is_said(
    status: TrainingJobStatus, pods: list[NodePod], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(LogsError) as error:
        plan("job", "team-a", status, 2, pods, **options)
    assert str(error.value) == message


def test_ended_line() -> None:
    started = NodePod("job-node-0", 0, 0, "Running", True)
    assert ended_line(None, started) == "[node-0] log ended: pod job-node-0 was deleted"
    assert ended_line(NodePod("job-node-0", 0, 0, "Succeeded", True), started) == (
        "[node-0] log ended: pod job-node-0 is Succeeded"
    )
    assert ended_line(started, started) == "[node-0] log stream closed: pod job-node-0 is still Running"
    blocked = NodePod("job-node-0", 0, 0, "Pending", False, "ErrImagePull", "not found")
    assert (
        ended_line(blocked, started) == "[node-0] pod job-node-0: container trainer is waiting: ErrImagePull: not found"
    )
    # -f names the attempt of every line.
    followed = partial(naming.attempt_line, 2)
    assert ended_line(None, started, followed) == "[attempt 2 node-0] log ended: pod job-node-0 was deleted"


@pytest.mark.parametrize(
    ("configmap", "expected"),
    [
        (
            {
                "metadata": {"labels": {"kubetrain.dev/job-uid": "u"}},
                "data": {"node-0.log": "a", "node-10.log": "b", "x": "c"},
            },
            {0: "a", 10: "b"},
        ),
        ({"metadata": {"labels": {"kubetrain.dev/job-uid": "other"}}, "data": {"node-0.log": "a"}}, None),
        ({"metadata": {}, "data": {"node-0.log": "a"}}, None),
    ],
)
def test_an_archive_is_read_only_if_it_is_this_jobs(configmap: dict[str, Any], expected: dict[int, str] | None) -> None:
    assert archive_of(configmap, "u") == expected


@pytest.mark.parametrize(("tail", "kept"), [(None, "a\nb\nc\n"), (2, "b\nc\n"), (0, ""), (9, "a\nb\nc\n")])
def test_last_lines(tail: int | None, kept: str) -> None:
    assert last_lines("a\nb\nc\n", tail) == kept


def test_the_ranks_whose_logs_only_an_archive_can_have() -> None:
    assert missing(NEW_AND_OLD, 1, [0, 1]) == [1]
    assert missing(NEW_AND_OLD, 0, [0, 1]) == [1]
    assert missing(nodes(pod(0, phase="Pending", state=CREATING)), 0, [0]) == [0]  # never started
    assert missing(BOTH, 0, [0, 1]) == []
