"""`kubetrain logs`: every node's log of a TrainingJob's attempt, read from the cluster.

The pure half decides which pods to read and what to say about those that have no log
(`plan`, table-tested); the I/O half (`run_logs`) reads the job and its pods from a
`LogSource` (`Cluster`: the kubernetes client; kubetrain.client's local backend: a local run),
prints the logs or follows them (one thread per pod, one printer), each line prefixed
`[node-i]` as `kubetrain run --local` prefixes them (`naming.node_line`).

Pods are found by the labels the operator gives them (job name, job uid, attempt, rank): a
gang restart deletes every pod of the failed attempt before it creates the next one under
the same names, so the failed attempt's logs exist only until then (`--previous-attempt`
says when they are gone, and shows what the operator recorded of the failure instead).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, cast

from kubetrain.api import naming
from kubetrain.api.models import TrainingJobStatus

# The container is being set up and will start by itself: `-f` waits for these, and for
# pods not yet scheduled. Every other waiting reason (ImagePullBackOff, ErrImagePull,
# CreateContainerConfigError, ...) needs someone to act and is reported instead.
STARTING = frozenset({"ContainerCreating", "PodInitializing"})
PREVIOUS_TAIL = 50  # lines of a failed attempt's pods shown when --tail is not given
SETTLE_SECONDS = 30.0  # -f: how long a pod whose log stream closed may still be reported Running


class LogsError(Exception):
    """What `kubetrain logs` cannot do, in words for the user (exit code 1)."""


@dataclass(frozen=True)
class NodePod:
    """What `kubetrain logs` needs of one pod of the job (from the API object, `from_pod`)."""

    name: str
    rank: int
    attempt: int
    phase: str
    started: bool  # the trainer container runs or ran (restartPolicy Never: once): it has a log
    waiting: str | None = None  # the trainer container's waiting reason
    message: str = ""  # why it waits, or why the pod is not scheduled

    @staticmethod
    def from_pod(pod: Mapping[str, Any]) -> NodePod | None:
        """`pod` is the API object as JSON (camelCase); None if it lacks kubetrain's labels."""
        labels = pod.get("metadata", {}).get("labels") or {}
        rank, attempt = labels.get(naming.LABEL_NODE_RANK, ""), labels.get(naming.LABEL_ATTEMPT, "")
        if not (rank.isdigit() and attempt.isdigit()):
            return None
        status = pod.get("status") or {}
        container: dict[str, Any] = next(
            (c for c in status.get("containerStatuses") or [] if c.get("name") == naming.CONTAINER_NAME), {}
        )
        state = container.get("state") or {}
        waiting = state.get("waiting")
        unscheduled = next(
            (
                c
                for c in status.get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ),
            None,
        )
        why = waiting if waiting else unscheduled
        return NodePod(
            name=pod["metadata"]["name"],
            rank=int(rank),
            attempt=int(attempt),
            phase=status.get("phase") or "Pending",
            started="running" in state or "terminated" in state,
            waiting=waiting.get("reason") if waiting else None,
            message=(why or {}).get("message") or "",
        )

    def blocked(self) -> bool:
        """Waits on something that will not resolve by itself (a bad image, a missing Secret)."""
        return not self.started and self.waiting is not None and self.waiting not in STARTING

    def why_no_log(self) -> str:
        if self.waiting:
            what = f"container {naming.CONTAINER_NAME} is waiting: {self.waiting}"
        elif self.phase == "Pending":
            what = "Pending, not started" + ("" if not self.message else " (not scheduled)")
        else:
            what = f"{self.phase}, its container never started"
        why = f": {self.message}" if self.message else ""
        return naming.node_line(self.rank, f"pod {self.name}: {what}{why}")


@dataclass(frozen=True)
class Plan:
    attempt: int
    read: list[NodePod]  # pods whose log is read now
    wait: list[NodePod] = field(default_factory=list)  # -f: pods whose log is read once they start
    problems: list[str] = field(default_factory=list)  # pods (or ranks) with no log, in words


def plan(
    name: str,
    namespace: str,
    status: TrainingJobStatus,
    nodes: int,
    pods: Sequence[NodePod],
    *,
    rank: int | None = None,
    previous: bool = False,
    follow: bool = False,
) -> Plan:
    """Which pods of trainingjob `namespace/name` (spec.nodes `nodes`) to read. Raises
    LogsError when there is nothing to read at all."""
    if previous and follow:
        raise LogsError("--previous-attempt with -f: a failed attempt's pods have ended, there is nothing to follow")
    if rank is not None and not 0 <= rank < nodes:
        raise LogsError(f"--rank {rank}: trainingjob {name} has {nodes} nodes (ranks 0-{nodes - 1})")
    attempt = _attempt(name, namespace, status, previous)
    ranks = [rank] if rank is not None else list(range(nodes))
    ours = sorted((p for p in pods if p.attempt == attempt and p.rank in ranks), key=lambda p: p.rank)
    if not ours:
        raise LogsError(_no_pods(name, namespace, status, attempt, previous))
    waiting = [p for p in ours if not p.started and follow and not p.blocked()]
    have = {p.rank for p in ours}
    problems = [p.why_no_log() for p in ours if not p.started and p not in waiting]
    problems += [naming.node_line(r, f"no pod of attempt {attempt}") for r in ranks if r not in have]
    return Plan(attempt, [p for p in ours if p.started], waiting, problems)


def _attempt(name: str, namespace: str, status: TrainingJobStatus, previous: bool) -> int:
    if not previous:
        return status.attempt
    if not status.failures:
        raise LogsError(
            f"trainingjob {name} in namespace {namespace} has no failed attempt (it is in attempt {status.attempt})"
        )
    return status.failures[-1].attempt


def _no_pods(name: str, namespace: str, status: TrainingJobStatus, attempt: int, previous: bool) -> str:
    if not previous:
        return (
            f"trainingjob {name} in namespace {namespace} has no pods of attempt {attempt} yet "
            f"(phase {status.phase or 'Pending'})"
        )
    failure = (status.failures or [])[-1]
    where = "" if failure.rank is None else f" on node {failure.rank}"
    said = f"{failure.reason}{where}" + (f": {failure.message}" if failure.message else "")
    return (
        f"the pods of trainingjob {name}'s failed attempt {attempt} are gone (a gang restart deletes them "
        f"before it creates the next attempt); the operator recorded: {said}"
    )


def selector(name: str, uid: str) -> str:
    """The pods of this job object only: a deleted and re-created job of the same name has
    another uid, and its leftover pods are not this job's."""
    return f"{naming.LABEL_JOB}={name},{naming.LABEL_JOB_UID}={uid}"


def ended_line(now: NodePod | None, pod: NodePod) -> str:
    """What `-f` says when it stops following `pod`, which is `now` (None: deleted)."""
    if now is None:
        return naming.node_line(pod.rank, f"log ended: pod {pod.name} was deleted")
    if not now.started:
        return now.why_no_log()
    if now.phase == "Running":
        return naming.node_line(pod.rank, f"log stream closed: pod {pod.name} is still Running")
    return naming.node_line(pod.rank, f"log ended: pod {pod.name} is {now.phase}")


# --- I/O ---------------------------------------------------------------------------------------


def api_client(kubeconfig: Path | None) -> Any:
    """The usual rules: --kubeconfig, else KUBECONFIG or ~/.kube/config, else (in a pod with
    neither) the pod's ServiceAccount."""
    from kubernetes import client, config

    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    return config.new_client_from_config(config_file=str(kubeconfig) if kubeconfig else None)  # type: ignore[no-untyped-call]


class LogSource(Protocol):
    """The reads `run_logs` makes: the job (as its API object, camelCase), its pods, their logs."""

    @property
    def namespace(self) -> str: ...
    def job(self, name: str) -> dict[str, Any]: ...
    def pods(self, label_selector: str) -> list[NodePod]: ...
    def pod(self, pod: NodePod) -> NodePod | None:
        """`pod` as it is now; None once it is gone."""
        ...

    def log(self, pod: NodePod, tail: int | None) -> str: ...
    def stream(self, pod: NodePod, tail: int | None) -> Iterator[str]:
        """The log's lines (without line ends) as they come, until the container ends."""
        ...


@dataclass
class Cluster:
    """The reads `kubetrain logs` makes; one object so the command has one place of I/O."""

    api: Any
    namespace: str

    def job(self, name: str) -> dict[str, Any]:
        from kubernetes import client

        try:
            job = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                naming.GROUP, naming.VERSION, self.namespace, naming.PLURAL, name
            )
        except client.ApiException as error:
            if error.status == 404:
                raise LogsError(f"trainingjob {name} not found in namespace {self.namespace}") from None
            raise
        return cast(dict[str, Any], job)

    def pods(self, label_selector: str) -> list[NodePod]:
        from kubernetes import client

        found = client.CoreV1Api(self.api).list_namespaced_pod(self.namespace, label_selector=label_selector)
        pods = (NodePod.from_pod(self.api.sanitize_for_serialization(p)) for p in found.items)
        return [p for p in pods if p is not None]

    def pod(self, pod: NodePod) -> NodePod | None:
        from kubernetes import client

        try:
            found = client.CoreV1Api(self.api).read_namespaced_pod(pod.name, self.namespace)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise
        return NodePod.from_pod(self.api.sanitize_for_serialization(found))

    def log(self, pod: NodePod, tail: int | None) -> str:
        from kubernetes import client

        text: str = client.CoreV1Api(self.api).read_namespaced_pod_log(
            pod.name, self.namespace, container=naming.CONTAINER_NAME, tail_lines=tail
        )
        return text

    def stream(self, pod: NodePod, tail: int | None) -> Iterator[str]:
        from kubernetes import client, watch

        core = client.CoreV1Api(self.api)
        kwargs = {"container": naming.CONTAINER_NAME, "tail_lines": tail}
        yield from watch.Watch().stream(core.read_namespaced_pod_log, pod.name, self.namespace, **kwargs)  # type: ignore[no-untyped-call]


def read_plan(cluster: LogSource, name: str, *, rank: int | None, previous: bool, follow: bool) -> Plan:
    """The plan for trainingjob `name` as it is now (reads the job and its pods)."""
    job = cluster.job(name)
    status = TrainingJobStatus.model_validate(job.get("status") or {})
    pods = cluster.pods(selector(name, job["metadata"]["uid"]))
    nodes = job["spec"]["nodes"]
    return plan(name, cluster.namespace, status, nodes, pods, rank=rank, previous=previous, follow=follow)


def run_logs(
    cluster: LogSource,
    name: str,
    *,
    rank: int | None,
    previous: bool,
    follow: bool,
    tail: int | None,
    out: IO[str],
    err: IO[str],
    poll: float = 1.0,
) -> int:
    """Print (or with `follow` stream) the logs; 0 when every asked-for node's log was read."""
    todo = read_plan(cluster, name, rank=rank, previous=previous, follow=follow)
    if previous and tail is None:
        tail = PREVIOUS_TAIL
    for problem in todo.problems:
        print(problem, file=err, flush=True)
    if follow:
        _follow(cluster, [*todo.read, *todo.wait], tail, out, err, poll)
    else:
        for pod in todo.read:
            for line in cluster.log(pod, tail).splitlines():
                print(naming.node_line(pod.rank, line), file=out)
        out.flush()
    return 1 if todo.problems else 0


def _follow(
    cluster: LogSource, pods: Sequence[NodePod], tail: int | None, out: IO[str], err: IO[str], poll: float
) -> None:
    """One reader thread per pod and one printer (this thread), so lines never interleave
    mid-line. Returns when every pod's stream has ended, each end said on `err`."""
    lines: queue.Queue[tuple[IO[str] | None, str]] = queue.Queue()
    for pod in pods:
        reader = (cluster, pod, tail, poll, lines.put, out, err)
        threading.Thread(target=_read, args=reader, name=f"logs-{pod.name}", daemon=True).start()
    running = len(pods)
    while running:
        stream, text = lines.get()
        if stream is None:
            running -= 1
        else:
            print(text, file=stream, flush=True)


def _read(
    cluster: LogSource,
    pod: NodePod,
    tail: int | None,
    poll: float,
    send: Callable[[tuple[IO[str] | None, str]], None],
    out: IO[str],
    err: IO[str],
) -> None:
    """Follow one pod: wait until its container starts, stream its log, say how it ended.
    `(None, "")` marks the end."""
    try:
        current = _started(cluster, pod, poll)
        if current is not None and current.started:
            for line in cluster.stream(pod, tail):
                send((out, naming.node_line(pod.rank, line)))
            current = _settled(cluster, pod, poll)
        send((err, ended_line(current, pod)))
    # Any error: a reader's failure must reach the user, not end its thread silently.
    except Exception as error:
        send((err, naming.node_line(pod.rank, f"reading the log of pod {pod.name} failed: {error}")))
    finally:
        send((None, ""))


def _settled(cluster: LogSource, pod: NodePod, poll: float) -> NodePod | None:
    """`pod` once its phase says how it ended. The log stream closes when the container exits,
    a moment before the kubelet reports it (on a real node `-f` said "is Running" at the end of
    every pod); a stream that closes for another reason is reported after SETTLE_SECONDS."""
    current = cluster.pod(pod)
    deadline = time.monotonic() + SETTLE_SECONDS
    while current is not None and current.phase == "Running" and time.monotonic() < deadline:
        time.sleep(poll)
        current = cluster.pod(pod)
    return current


def _started(cluster: LogSource, pod: NodePod, poll: float) -> NodePod | None:
    """`pod` once its container has started, or as it is when it never will (blocked, ended
    without starting); None when it was deleted first."""
    current: NodePod | None = pod
    while current is not None and not current.started and not current.blocked() and current.phase == "Pending":
        time.sleep(poll)
        current = cluster.pod(pod)
    return current
