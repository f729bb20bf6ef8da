"""Pure: which pods' logs to archive now, what the archive holds, and the patches that write it.

A pod's log lives and dies with the pod: a gang restart deletes the failed attempt's pods,
`cleanPodPolicy` the finished ones, and the kubelet removes a deleted pod's containers (and
their log files) within a second of their exit. So every pod kubetrain creates carries the
finalizer `kubetrain.dev/logs` (naming.LOG_FINALIZER): a pod being deleted stays an object
until the operator has copied the tail of its trainer log and taken the finalizer off.

Where: one ConfigMap per attempt, `<job>-attempt-<N>-logs` (naming.log_archive_name), a key
`node-<rank>.log` per node, labelled with the job's name and uid and the attempt, owned by the
TrainingJob (a controller ownerReference: it is garbage-collected with the job). A ConfigMap
needs no volume and no store outside the cluster, outlives the pods and the operator's
restarts, and `kubectl get configmap -o yaml` reads it with the same kind of RBAC as the rest.

How much: a ConfigMap holds 1 MiB, so an attempt keeps ARCHIVE_BYTES in all and each node the
last `node_budget(nodes)` bytes of its log: 64 KiB up to 14 nodes, then 900 KiB / nodes; the
cut is made at a line boundary.

When (`plan`), for each pod of ours with the finalizer:
  * its TrainingJob is gone or being deleted, or the pod is another job's of the same name:
    release it (nothing to keep: the archive would go with the job);
  * not being deleted: nothing yet (its log is still there);
  * being deleted, its trainer container has terminated: archive the tail, then release;
  * being deleted while the container still runs (it is handling SIGTERM): capture, i.e.
    follow its log, so that its very last lines (the checkpoint written on SIGTERM, a
    traceback) are kept even if the kubelet removes the container before the next read (a
    pod the operator deletes itself is followed before the delete: archive_io.follow_before_delete);
  * final, whatever the container says: the kubelet's own last delete (grace 0, after the
    containers stopped; or a forced delete), or RELEASE_MARGIN_SECONDS past the end of the
    grace period (the kubelet or its node is gone): archive what can be read, then release;
  * never started: release (there is no log).
The archive is written before the finalizer is removed, and both are safe to repeat, so an
operator that dies between them redoes both on its next pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob
from kubetrain.operator.pods import TERMINAL_PHASES, PodView
from kubetrain.operator.render import owner_reference

# A ConfigMap holds at most 1 MiB (data and metadata): the tails of one attempt share 900 KiB,
# and no node keeps more than NODE_BYTES.
ARCHIVE_BYTES = 900 * 1024
NODE_BYTES = 64 * 1024
# Past the end of a pod's grace period by this much, a container still reported running has a
# kubelet that no longer reports (a lost node): archive what can be read and let the pod go.
RELEASE_MARGIN_SECONDS = 15.0
# pods/log is asked for the last `budget // AVERAGE_LINE_BYTES` lines (at least MIN_LINES) and
# cut to the budget here: `limitBytes` would keep the start of that window, not its end.
AVERAGE_LINE_BYTES = 16
MIN_LINES = 100


def node_budget(nodes: int) -> int:
    """Bytes of each node's log tail an attempt of a `nodes`-node job keeps."""
    return min(NODE_BYTES, ARCHIVE_BYTES // max(1, nodes))


def tail_lines(budget: int) -> int:
    """How many lines to ask pods/log for, to fill `budget` bytes."""
    return max(MIN_LINES, budget // AVERAGE_LINE_BYTES)


def cut_marker(dropped: int) -> str:
    return f"[kubetrain: the {dropped} bytes before this line were cut; the archive keeps a log's last lines]\n"


def cut(text: str, budget: int) -> str:
    """The end of `text` in at most `budget` bytes of UTF-8, starting at a line boundary, after a
    line that says how much was cut."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= budget:
        return text
    room = max(0, budget - len(cut_marker(len(data))))
    start = len(data) - room
    kept = data[start:]
    newline = kept.find(b"\n")
    if data[start - 1 : start] != b"\n" and 0 <= newline < len(kept) - 1:
        kept = kept[newline + 1 :]
    # A single line longer than the budget: its end, cut at a character boundary.
    body = kept.decode("utf-8", errors="ignore")
    return cut_marker(len(data) - len(body.encode())) + body


def unreadable(pod: PodView, error: str) -> str:
    """What the archive says of a pod whose log could not be read."""
    return f"[kubetrain: the log of pod {pod.name} could not be read when it was deleted: {error}]\n"


@dataclass(frozen=True)
class Plan:
    """What one reconcile pass does about the pods holding kubetrain's finalizer."""

    archive: list[PodView] = field(default_factory=list)  # read the tail, keep it, then release
    capture: list[PodView] = field(default_factory=list)  # being stopped: follow the log meanwhile
    release: list[PodView] = field(default_factory=list)  # nothing to keep: remove the finalizer
    look_again: float | None = None  # seconds until a pod being stopped is due regardless


def holds(pod: PodView) -> bool:
    return naming.LOG_FINALIZER in pod.finalizers


def plan(pods: Sequence[PodView], job_uid: str | None, now: datetime) -> Plan:
    """`job_uid`: the live TrainingJob's uid; None when it is gone or being deleted."""
    archive: list[PodView] = []
    capture: list[PodView] = []
    release: list[PodView] = []
    waits: list[float] = []
    for pod in pods:
        if not holds(pod):
            continue
        if job_uid is None or pod.job_uid != job_uid:
            release.append(pod)
            continue
        if pod.deleted_at is None:
            continue
        deadline = pod.deleted_at + timedelta(seconds=RELEASE_MARGIN_SECONDS)
        final = pod.deletion_grace == 0 or now >= deadline
        terminated = pod.exit_code is not None or pod.phase in TERMINAL_PHASES
        if pod.has_run and (terminated or final):
            archive.append(pod)
        elif not pod.has_run and (final or not pod.scheduled):
            release.append(pod)
        else:
            waits.append((deadline - now).total_seconds())
            if pod.has_run:
                capture.append(pod)
    return Plan(archive, capture, release, min(waits) if waits else None)


def entries(texts: Mapping[int, str], nodes: int) -> dict[str, str]:
    """The ConfigMap data for these ranks' log texts, each cut to its budget."""
    budget = node_budget(nodes)
    return {naming.log_archive_key(rank): cut(text, budget) for rank, text in sorted(texts.items())}


def labels(job_name: str, job_uid: str, attempt: int) -> dict[str, str]:
    return {
        naming.LABEL_JOB: job_name,
        naming.LABEL_JOB_UID: job_uid,
        naming.LABEL_ATTEMPT: str(attempt),
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
        naming.LABEL_COMPONENT: naming.COMPONENT_LOGS,
    }


def configmap(job: TrainingJob, namespace: str, uid: str, attempt: int, data: Mapping[str, str]) -> dict[str, Any]:
    """The archive of `attempt`, as first created."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": naming.log_archive_name(job.name, attempt),
            "namespace": namespace,
            "labels": labels(job.name, uid, attempt),
            "ownerReferences": [owner_reference(job, uid)],
        },
        "data": dict(data),
    }


def _pointer(key: str) -> str:
    """A JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def update(uid: str, data: Mapping[str, str]) -> list[dict[str, Any]]:
    """A JSON patch adding `data` to an existing archive, only if it is this job's (a ConfigMap
    of that name that is not, a user's or a deleted job's, fails the test and is left alone)."""
    owner = {"op": "test", "path": f"/metadata/labels/{_pointer(naming.LABEL_JOB_UID)}", "value": uid}
    return [owner, *({"op": "add", "path": f"/data/{_pointer(k)}", "value": v} for k, v in sorted(data.items()))]


def release(pod: PodView) -> list[dict[str, Any]] | None:
    """A JSON patch removing kubetrain's finalizer from `pod` (None: it has none). The test pins
    the index, so another controller's finalizer is never removed in its place."""
    if not holds(pod):
        return None
    path = f"/metadata/finalizers/{pod.finalizers.index(naming.LOG_FINALIZER)}"
    return [{"op": "test", "path": path, "value": naming.LOG_FINALIZER}, {"op": "remove", "path": path}]
