"""The log reader that `kubetrain logs` and the client's `Job.logs` share: every node's log of
one attempt of a TrainingJob, read from the cluster or a local run. It lives with the client, its
first user; the CLI imports it from here (the CLI imports the client, never the reverse).

Where a log comes from: the attempt's pod while it exists (`pods/log`), else the attempt's log
archive, the ConfigMap `<job>-attempt-<N>-logs` in which the operator keeps the tail of each
pod's log before the pod may go (operator/archive.py, docs/logs.md). So a failed attempt's
traceback is there after the gang restart and after `cleanPodPolicy` deleted its pods.

The pure half decides which attempt, which pods and which archived logs to read and what to say
about the ranks that have neither (`choose_attempt`, `plan`, table-tested); the I/O half reads
from a `LogSource` (`Cluster`: the kubernetes client; kubetrain.client's local backend: a local
run's files):
  * `attempt_logs(source, name, attempt=N, rank=R, tail=T)` -> `AttemptLogs` (rank -> text),
    the reusable read (`Job.logs(attempt=N)` uses it);
  * `run_logs(...)` prints one attempt, each line prefixed `[node-i]` as `kubetrain run --local`
    prefixes them (`naming.node_line`), or with `follow` streams the job from that attempt on,
    across its gang restarts, each line prefixed `[attempt N node-i]` (`naming.attempt_line`).

Pods are found by the labels the operator gives them (job name, job uid, attempt, rank).
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
PREVIOUS_TAIL = 50  # lines of each node of the previous attempt shown when --tail is not given
SETTLE_SECONDS = 30.0  # -f: how long a pod whose log stream closed may still be reported Running
FINISHED = ("Succeeded", "Failed")


class LogsError(Exception):
    """What `kubetrain logs` cannot do, in words for the user (exit code 1)."""


class NothingToRead(LogsError):
    """The attempt has neither pods with a log nor an archive to read."""


Line = Callable[[int, str], str]  # (rank, text) -> the prefixed line


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

    def why_no_log(self, line: Line = naming.node_line) -> str:
        if self.waiting:
            what = f"container {naming.CONTAINER_NAME} is waiting: {self.waiting}"
        elif self.phase == "Pending":
            what = "Pending, not started" + ("" if not self.message else " (not scheduled)")
        else:
            what = f"{self.phase}, its container never started"
        why = f": {self.message}" if self.message else ""
        return line(self.rank, f"pod {self.name}: {what}{why}")


@dataclass(frozen=True)
class Plan:
    attempt: int
    read: list[NodePod]  # pods whose log is read
    archived: list[int] = field(default_factory=list)  # ranks read from the attempt's log archive
    problems: list[str] = field(default_factory=list)  # pods (or ranks) with no log, in words


@dataclass(frozen=True)
class AttemptLogs:
    """One attempt's logs: rank -> text (the whole log of a live pod, or its archived tail, each
    cut to `tail` lines when asked), where each came from, and the ranks without one, in words."""

    attempt: int
    logs: dict[int, str]
    sources: dict[int, str]  # rank -> "pod <name>" or "archive <configmap>"
    problems: list[str]


def finished(status: TrainingJobStatus) -> bool:
    return any(c.type in FINISHED and c.status == "True" for c in status.conditions or [])


def choose_attempt(
    name: str, namespace: str, status: TrainingJobStatus, attempt: int | None = None, previous: bool = False
) -> int:
    """The attempt asked for: `attempt`, the one before the current with `previous`, else the
    current one."""
    if previous and attempt is not None:
        raise LogsError("--previous-attempt and --attempt: give one of them")
    if previous:
        if status.attempt == 0:
            raise LogsError(f"trainingjob {name} in namespace {namespace} has no failed attempt (it is in attempt 0)")
        return status.attempt - 1
    if attempt is None:
        return status.attempt
    if not 0 <= attempt <= status.attempt:
        raise LogsError(
            f"--attempt {attempt}: trainingjob {name} in namespace {namespace} has attempts 0-{status.attempt} "
            f"(it is in attempt {status.attempt})"
        )
    return attempt


def missing(pods: Sequence[NodePod], attempt: int, ranks: Sequence[int]) -> list[int]:
    """The ranks of `attempt` that have no started pod: their logs can only be archived ones."""
    started = {p.rank for p in pods if p.attempt == attempt and p.started}
    return [r for r in ranks if r not in started]


def plan(
    name: str,
    namespace: str,
    status: TrainingJobStatus,
    nodes: int,
    pods: Sequence[NodePod],
    *,
    rank: int | None = None,
    attempt: int | None = None,
    previous: bool = False,
    archived: Mapping[int, str] | None = None,
) -> Plan:
    """What to read of trainingjob `namespace/name` (spec.nodes `nodes`): the attempt's started
    pods, else the ranks in `archived` (its log archive; None: there is none). Raises
    NothingToRead when the attempt has neither pods nor archived logs of the ranks asked for."""
    if rank is not None and not 0 <= rank < nodes:
        raise LogsError(f"--rank {rank}: trainingjob {name} has {nodes} nodes (ranks 0-{nodes - 1})")
    attempt = choose_attempt(name, namespace, status, attempt, previous)
    ranks = [rank] if rank is not None else list(range(nodes))
    ours = sorted((p for p in pods if p.attempt == attempt and p.rank in ranks), key=lambda p: p.rank)
    kept = archived or {}
    started = {p.rank for p in ours if p.started}
    from_archive = [r for r in ranks if r not in started and r in kept]
    if not ours and not from_archive:
        raise NothingToRead(_nothing(name, namespace, status, attempt, archived))
    have = {p.rank for p in ours}
    problems = [p.why_no_log() for p in ours if not p.started and p.rank not in kept]
    problems += [
        naming.node_line(r, f"no pod and no archived log of attempt {attempt}")
        for r in ranks
        if r not in have | kept.keys()
    ]
    return Plan(attempt, [p for p in ours if p.started], from_archive, problems)


def _nothing(
    name: str, namespace: str, status: TrainingJobStatus, attempt: int, archived: Mapping[int, str] | None
) -> str:
    archive = naming.log_archive_name(name, attempt)
    if attempt == status.attempt and not finished(status) and archived is None:
        phase = status.phase or "Pending"
        return f"trainingjob {name} in namespace {namespace} has no pods of attempt {attempt} yet (phase {phase})"
    kept = "no archived log" if archived is None else "an archive without these nodes"
    said = ""
    failure = next((f for f in reversed(status.failures or []) if f.attempt == attempt), None)
    if failure is not None:
        where = "" if failure.rank is None else f" on node {failure.rank}"
        said = f"; the operator recorded: {failure.reason}{where}" + (f": {failure.message}" if failure.message else "")
    return (
        f"trainingjob {name} in namespace {namespace}: attempt {attempt} has no pods left and {kept} "
        f"(ConfigMap {archive}){said}"
    )


def selector(name: str, uid: str, attempt: int | None = None) -> str:
    """The pods of this job object only (of `attempt`, if given): a deleted and re-created job of
    the same name has another uid, and its leftover pods are not this job's."""
    found = f"{naming.LABEL_JOB}={name},{naming.LABEL_JOB_UID}={uid}"
    return found if attempt is None else f"{found},{naming.LABEL_ATTEMPT}={attempt}"


def last_lines(text: str, tail: int | None) -> str:
    """The last `tail` lines of `text` (all of it for None), as pods/log's tailLines."""
    if tail is None:
        return text
    lines = text.splitlines(keepends=True)
    return "".join(lines[len(lines) - tail :] if tail else [])


def ended_line(now: NodePod | None, pod: NodePod, line: Line = naming.node_line) -> str:
    """What `-f` says when it stops following `pod`, which is `now` (None: deleted)."""
    if now is None:
        return line(pod.rank, f"log ended: pod {pod.name} was deleted")
    if not now.started:
        return now.why_no_log(line)
    if now.phase == "Running":
        return line(pod.rank, f"log stream closed: pod {pod.name} is still Running")
    return line(pod.rank, f"log ended: pod {pod.name} is {now.phase}")


def archive_of(configmap: Mapping[str, Any], uid: str) -> dict[int, str] | None:
    """rank -> archived log of a log archive ConfigMap (as JSON); None if it is not this job's
    (`uid`): a user's of that name, or a deleted job's the garbage collector has yet to remove."""
    meta = configmap.get("metadata") or {}
    if (meta.get("labels") or {}).get(naming.LABEL_JOB_UID) != uid:
        return None
    data = configmap.get("data") or {}
    return {rank: text for key, text in data.items() if (rank := naming.log_archive_rank(key)) is not None}


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
    """The reads `kubetrain logs` makes: the job (as its API object, camelCase), its pods, their
    logs, and its log archives."""

    @property
    def namespace(self) -> str: ...
    def job(self, name: str) -> dict[str, Any]:
        """The job; LogsError when there is none."""
        ...

    def pods(self, label_selector: str) -> list[NodePod]: ...
    def pod(self, pod: NodePod) -> NodePod | None:
        """`pod` as it is now; None once it is gone."""
        ...

    def log(self, pod: NodePod, tail: int | None) -> str: ...
    def stream(self, pod: NodePod, tail: int | None) -> Iterator[str]:
        """The log's lines (without line ends) as they come, until the container ends."""
        ...

    def archive(self, name: str, uid: str, attempt: int) -> dict[int, str] | None:
        """rank -> archived log of the attempt; None when it has no archive."""
        ...

    def archived_attempts(self, name: str, uid: str) -> list[int]: ...


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

    def archive(self, name: str, uid: str, attempt: int) -> dict[int, str] | None:
        """rank -> archived log of the attempt's log archive; None when there is none of this job."""
        from kubernetes import client

        try:
            found = client.CoreV1Api(self.api).read_namespaced_config_map(
                naming.log_archive_name(name, attempt), self.namespace
            )
        except client.ApiException as error:
            if error.status == 404:
                return None
            if error.status == 403:
                raise LogsError(f"reading the log archive of attempt {attempt} is forbidden: {error.reason}") from None
            raise
        return archive_of(self.api.sanitize_for_serialization(found), uid)

    def archived_attempts(self, name: str, uid: str) -> list[int]:
        from kubernetes import client

        try:
            found = client.CoreV1Api(self.api).list_namespaced_config_map(
                self.namespace, label_selector=naming.log_archive_selector(name, uid)
            )
        except client.ApiException as error:  # no `list configmaps` for this user: say what is known
            raise LogsError(f"listing the log archives is forbidden: {error.reason}") from None
        labels = (((c.metadata and c.metadata.labels) or {}).get(naming.LABEL_ATTEMPT, "") for c in found.items)
        return sorted(int(value) for value in labels if value.isdigit())


def attempt_logs(
    cluster: LogSource,
    name: str,
    *,
    attempt: int | None = None,
    rank: int | None = None,
    previous: bool = False,
    tail: int | None = None,
) -> AttemptLogs:
    """Every node's (or node `rank`'s) log of `attempt` of trainingjob `name` (default: the
    current attempt; `previous`: the one before it): from its pods while they exist, else from
    its log archive. Raises LogsError when the job is missing or nothing can be read."""
    job = cluster.job(name)
    status = TrainingJobStatus.model_validate(job.get("status") or {})
    uid, nodes = job["metadata"]["uid"], job["spec"]["nodes"]
    number = choose_attempt(name, cluster.namespace, status, attempt, previous)
    pods = cluster.pods(selector(name, uid, number))
    ranks = [rank] if rank is not None else list(range(nodes))
    archived = cluster.archive(name, uid, number) if missing(pods, number, ranks) else None
    try:
        todo = plan(name, cluster.namespace, status, nodes, pods, rank=rank, attempt=number, archived=archived)
    except NothingToRead as nothing:
        try:
            kept = ", ".join(map(str, cluster.archived_attempts(name, uid))) or "none"
        except LogsError as error:
            kept = f"unknown ({error})"
        raise LogsError(f"{nothing}; archived attempts: {kept}") from None
    archive = f"archive {naming.log_archive_name(name, number)}"
    logs: dict[int, str] = {}
    sources: dict[int, str] = {}
    problems = list(todo.problems)
    for pod in todo.read:
        try:
            logs[pod.rank], sources[pod.rank] = cluster.log(pod, tail), f"pod {pod.name}"
        # Any error (the container removed since the pod was listed, the node gone): that
        # node's archive may have it, and the other nodes are read all the same.
        except Exception as error:
            archived = archived if archived is not None else cluster.archive(name, uid, number) or {}
            if pod.rank in archived:
                logs[pod.rank], sources[pod.rank] = last_lines(archived[pod.rank], tail), archive
            else:
                problems.append(naming.node_line(pod.rank, f"reading the log of pod {pod.name} failed: {error}"))
    for r in todo.archived:
        assert archived is not None
        logs[r], sources[r] = last_lines(archived[r], tail), archive
    return AttemptLogs(todo.attempt, dict(sorted(logs.items())), sources, problems)


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
    attempt: int | None = None,
    poll: float = 1.0,
) -> int:
    """Print (or with `follow` stream) the logs; 0 when every asked-for node's log was read."""
    if previous and tail is None:
        tail = PREVIOUS_TAIL
    if follow:
        return follow_logs(
            cluster, name, rank=rank, attempt=attempt, previous=previous, tail=tail, out=out, err=err, poll=poll
        )
    read = attempt_logs(cluster, name, attempt=attempt, rank=rank, previous=previous, tail=tail)
    for problem in read.problems:
        print(problem, file=err, flush=True)
    for r, text in read.logs.items():
        for line in text.splitlines():
            print(naming.node_line(r, line), file=out)
    out.flush()
    return 1 if read.problems else 0


# --- -f: the job from one attempt on, across its gang restarts --------------------------------

Said = tuple[IO[str] | None, str]  # a line for out or err; (None, "") ends a reader


def follow_logs(
    cluster: LogSource,
    name: str,
    *,
    rank: int | None = None,
    attempt: int | None = None,
    previous: bool = False,
    tail: int | None = None,
    out: IO[str],
    err: IO[str],
    poll: float = 1.0,
) -> int:
    """Stream every node's log from `attempt` (default: the current one) on: each attempt's pods
    until they end (a rank whose pod is gone from its archive), then the next attempt's, until
    the job finishes, is suspended or deleted. `tail` applies to the first attempt. 0 when every
    node's log was read."""
    job = cluster.job(name)
    status = TrainingJobStatus.model_validate(job.get("status") or {})
    uid, nodes = job["metadata"]["uid"], job["spec"]["nodes"]
    if rank is not None and not 0 <= rank < nodes:
        raise LogsError(f"--rank {rank}: trainingjob {name} has {nodes} nodes (ranks 0-{nodes - 1})")
    number: int | None = choose_attempt(name, cluster.namespace, status, attempt, previous)
    ranks = [rank] if rank is not None else list(range(nodes))
    failed = 0
    while number is not None:
        failed += _follow_attempt(cluster, name, uid, number, ranks, tail, out, err, poll)
        tail = None
        number = _next_attempt(cluster, name, uid, number, err, poll)
    return 1 if failed else 0


def _follow_attempt(
    cluster: LogSource,
    name: str,
    uid: str,
    attempt: int,
    ranks: Sequence[int],
    tail: int | None,
    out: IO[str],
    err: IO[str],
    poll: float,
) -> int:
    """One reader thread per rank and one printer (this thread), so lines never interleave
    mid-line. Returns, once every reader has ended, how many ranks had no log."""
    said: queue.Queue[Said] = queue.Queue()
    failed: list[int] = []
    for r in ranks:
        reader = _Reader(cluster, name, uid, attempt, r, tail, poll, said.put, out, err, failed)
        threading.Thread(target=reader.run, name=f"logs-{attempt}-{r}", daemon=True).start()
    running = len(ranks)
    while running:
        stream, text = said.get()
        if stream is None:
            running -= 1
        else:
            print(text, file=stream, flush=True)
    return len(failed)


def _next_attempt(cluster: LogSource, name: str, uid: str, attempt: int, err: IO[str], poll: float) -> int | None:
    """The attempt after `attempt` once the job has started it; None when the job finished, is
    suspended or was deleted (said on `err`)."""
    while True:
        status = _status(cluster, name, uid)
        if status is None:
            print(f"[kubetrain] trainingjob {name} was deleted", file=err, flush=True)
            return None
        if status.attempt > attempt:
            return attempt + 1
        if finished(status):
            return None
        if status.phase == "Suspended":
            print(f"[kubetrain] trainingjob {name} is suspended: its pods are deleted", file=err, flush=True)
            return None
        time.sleep(poll)


def _status(cluster: LogSource, name: str, uid: str) -> TrainingJobStatus | None:
    """The job's status; None once it is gone (or is another job of the same name)."""
    try:
        job = cluster.job(name)
    except LogsError:
        return None
    if job["metadata"]["uid"] != uid:
        return None
    return TrainingJobStatus.model_validate(job.get("status") or {})


@dataclass
class _Reader:
    """Follows node `rank` of `attempt`: waits for its pod, streams its log, says how it ended;
    prints its archived log instead when the pod is gone before it could be read."""

    cluster: LogSource
    name: str
    uid: str
    attempt: int
    rank: int
    tail: int | None
    poll: float
    send: Callable[[Said], None]
    out: IO[str]
    err: IO[str]
    failed: list[int]

    def line(self, rank: int, text: str) -> str:
        return naming.attempt_line(self.attempt, rank, text)

    def run(self) -> None:
        try:
            pod = self._pod()
            if pod is None or not self._stream(pod):
                self._archived()
        # Any error: a reader's failure must reach the user, not end its thread silently.
        except Exception as error:
            self.failed.append(self.rank)
            self.send((self.err, self.line(self.rank, f"reading the log failed: {error}")))
        finally:
            self.send((None, ""))

    def _pod(self) -> NodePod | None:
        """This rank's pod of the attempt once it exists; None once it cannot come any more (the
        job moved on to a later attempt, finished, or is gone)."""
        while True:
            pods = self.cluster.pods(selector(self.name, self.uid, self.attempt))
            found = next((p for p in pods if (p.attempt, p.rank) == (self.attempt, self.rank)), None)
            if found is not None:
                return found
            status = _status(self.cluster, self.name, self.uid)
            if status is None or status.attempt > self.attempt or finished(status):
                return None
            time.sleep(self.poll)

    def _stream(self, pod: NodePod) -> bool:
        """Stream `pod`'s log until its container ends; False when the pod was gone before it
        could be read (its archive may hold it)."""
        current = _started(self.cluster, pod, self.poll)
        if current is None or not current.started:
            if current is not None:
                self.failed.append(self.rank)
                self.send((self.err, ended_line(current, pod, self.line)))
            return current is not None
        streamed = False
        try:
            for text in self.cluster.stream(pod, self.tail):
                streamed = True
                self.send((self.out, self.line(self.rank, text)))
        # Its container removed before it could be read (a deleted pod's, by the kubelet): the
        # archive has its tail. An error after some lines were streamed is the reader's failure.
        except Exception:
            if streamed or _now(self.cluster, pod) is not None:
                raise
            return False
        self.send((self.err, ended_line(_settled(self.cluster, pod, self.poll), pod, self.line)))
        return True

    def _archived(self) -> None:
        archived = self.cluster.archive(self.name, self.uid, self.attempt) or {}
        if self.rank not in archived:
            self.failed.append(self.rank)
            self.send((self.err, self.line(self.rank, f"no pod and no archived log of attempt {self.attempt}")))
            return
        for text in last_lines(archived[self.rank], self.tail).splitlines():
            self.send((self.out, self.line(self.rank, text)))
        archive = naming.log_archive_name(self.name, self.attempt)
        self.send((self.err, self.line(self.rank, f"log ended: read from the archive {archive} (its pod is gone)")))


def _now(cluster: LogSource, pod: NodePod) -> NodePod | None:
    """`pod` as it is now; None when it is gone (its name may belong to a later attempt's pod)."""
    current = cluster.pod(pod)
    return current if current is not None and current.attempt == pod.attempt else None


def _settled(cluster: LogSource, pod: NodePod, poll: float) -> NodePod | None:
    """`pod` once its phase says how it ended. The log stream closes when the container exits,
    a moment before the kubelet reports it (on a real node `-f` said "is Running" at the end of
    every pod); a stream that closes for another reason is reported after SETTLE_SECONDS."""
    current = _now(cluster, pod)
    deadline = time.monotonic() + SETTLE_SECONDS
    while current is not None and current.phase == "Running" and time.monotonic() < deadline:
        time.sleep(poll)
        current = _now(cluster, pod)
    return current


def _started(cluster: LogSource, pod: NodePod, poll: float) -> NodePod | None:
    """`pod` once its container has started, or as it is when it never will (blocked, ended
    without starting); None when it was deleted first."""
    current: NodePod | None = pod
    while current is not None and not current.started and not current.blocked() and current.phase == "Pending":
        time.sleep(poll)
        current = _now(cluster, pod)
    return current
