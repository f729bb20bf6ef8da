"""kopf handlers: feed what the watches see into a per-job work queue; reconcile = observe,
decide (status.py, pure), apply (kube.py).

Why event handlers and a queue rather than kopf's on.create/on.update:
  * Those keep per-object progress in annotations and a last-handled-configuration,
    i.e. extra writes on every change; a level-based reconciler needs neither, and the
    TrainingJob status already holds all the state that must survive a restart.
  * A job must be reconciled when any of its pods changes; the queue coalesces the bursts
    (4 pods created → 1 reconcile, not 4) and serializes reconciles of one job.
Pods and Services are kopf indices: kopf fills them from its initial listing before any
other handler runs, so a restarted operator never mistakes "not in my cache yet" for
"missing" (which would recreate single pods of a running gang).

No finalizer: children carry a controller ownerReference, so the garbage collector removes
them with the job, and the operator never blocks a deletion.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from kubetrain.api import naming, records
from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.operator import metrics
from kubetrain.operator.kube import Conflict, Invalid, Kube, Refused
from kubetrain.operator.render import render_pod, render_service
from kubetrain.operator.settings import OperatorSettings
from kubetrain.operator.status import Decision, PodView, StaleView, decide, derive_phase, parse_time, set_condition

log = logging.getLogger("kubetrain.operator")
Key = tuple[str, str]  # (namespace, job name)
# How long a pod this operator created counts as observed before its watch event arrives.
OVERLAY_SECONDS = 60.0
LogSource = Callable[[str, str], Awaitable[str]]


def _rv(body: dict[str, Any]) -> int:
    try:
        return int(body["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1


class WorkQueue:
    """At most one reconcile per key at a time; triggers during a run cause one more run."""

    def __init__(self, work: Callable[[Key], Awaitable[float | None]]) -> None:
        self.work = work
        self.running: set[Key] = set()
        self.dirty: set[Key] = set()
        self.timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.failures: dict[Key, int] = {}

    def add(self, key: Key, delay: float = 0.0) -> None:
        loop = asyncio.get_running_loop()
        if delay > 0:
            due = loop.time() + delay
            pending = self.timers.get(key)
            if pending is not None and pending[0] <= due:
                return
            if pending is not None:
                pending[1].cancel()
            self.timers[key] = (due, loop.call_at(due, self._fire, key))
            return
        if key in self.running:
            self.dirty.add(key)
            return
        self.running.add(key)
        task = loop.create_task(self._run(key))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _fire(self, key: Key) -> None:
        self.timers.pop(key, None)
        self.add(key)

    def forget(self, key: Key) -> None:
        pending = self.timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()
        self.failures.pop(key, None)

    async def _run(self, key: Key) -> None:
        try:
            while True:
                self.dirty.discard(key)
                try:
                    requeue = await self.work(key)
                    self.failures.pop(key, None)
                except Exception as error:
                    metrics.RECONCILE_ERRORS.inc()
                    count = self.failures[key] = self.failures.get(key, 0) + 1
                    requeue = min(0.25 * 2**count, 60.0)
                    # An expected refusal (a namespace being deleted, a quota) needs its message only.
                    report = log.warning if isinstance(error, Refused) else log.exception
                    report("reconcile of %s/%s failed; retrying in %.1f s: %s", *key, requeue, error)
                if requeue is not None:
                    if requeue <= 0:
                        self.dirty.add(key)
                    else:
                        self.add(key, requeue)
                if key not in self.dirty:
                    return
        finally:
            self.running.discard(key)


@dataclass
class Operator:
    """Everything one operator process knows; built at startup."""

    settings: OperatorSettings
    kube: Kube
    log_source: LogSource
    jobs: dict[Key, dict[str, Any]] = field(default_factory=dict)
    pods_index: Any = None
    services_index: Any = None
    # Writes whose watch events may not have arrived yet.
    created_pods: dict[Key, dict[str, tuple[float, dict[str, Any]]]] = field(default_factory=dict)
    created_services: set[Key] = field(default_factory=set)
    deleting: set[str] = field(default_factory=set)
    progress_read: dict[Key, float] = field(default_factory=dict)
    phases: dict[Key, str] = field(default_factory=dict)
    queue: WorkQueue = field(init=False)

    def __post_init__(self) -> None:
        self.queue = WorkQueue(self.reconcile)

    # --- the cache ----------------------------------------------------------------------
    def remember_job(self, body: dict[str, Any]) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        known = self.jobs.get(key)
        if known is None or known["metadata"].get("uid") != body["metadata"].get("uid") or _rv(body) >= _rv(known):
            self.jobs[key] = body

    def forget_job(self, key: Key) -> None:
        self.jobs.pop(key, None)
        self.created_pods.pop(key, None)
        self.created_services.discard(key)
        self.progress_read.pop(key, None)
        self.phases.pop(key, None)
        self.queue.forget(key)
        self._count_phases()

    def observed_pods(self, key: Key) -> list[dict[str, Any]]:
        indexed = {p["metadata"]["uid"]: p for p in (self.pods_index.get(key, []) if self.pods_index else [])}
        fresh = self.created_pods.get(key, {})
        horizon = time.monotonic() - OVERLAY_SECONDS
        for uid in [uid for uid, (at, _) in fresh.items() if uid in indexed or at < horizon]:
            # The watch caught up; or it never will (the pod was gone before it was listed).
            del fresh[uid]
        return [*indexed.values(), *(pod for _, pod in fresh.values())]

    def pod_gone(self, key: Key, uid: str) -> None:
        self.deleting.discard(uid)
        self.created_pods.get(key, {}).pop(uid, None)

    def service_exists(self, key: Key) -> bool:
        return key in self.created_services or bool(self.services_index and self.services_index.get(key))

    def _count_phases(self) -> None:
        for phase in ("Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"):
            metrics.JOBS.labels(phase).set(sum(p == phase for p in self.phases.values()))

    # --- reconcile ----------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        body = self.jobs.get(key)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        started = time.perf_counter()
        try:
            return await self._reconcile(key, body)
        finally:
            metrics.RECONCILE.observe(time.perf_counter() - started)

    async def _reconcile(self, key: Key, body: dict[str, Any]) -> float | None:
        namespace, name = key
        uid = body["metadata"]["uid"]
        try:
            job = TrainingJob.model_validate(body)
        except ValidationError as error:
            # The CRD schema admits only valid jobs; this is an operator/CRD version skew.
            log.error("%s/%s is not a valid TrainingJob for this operator: %s", namespace, name, error)
            return None
        pods = [PodView.from_pod(p) for p in self.observed_pods(key)]
        pods = [replace(p, terminating=True) if p.uid in self.deleting else p for p in pods]
        now = datetime.now(UTC).replace(microsecond=0)
        try:
            decision = decide(job, uid, pods, self.service_exists(key), now, self.settings.policy)
        except StaleView as stale:
            fresh = await self.kube.get_job(namespace, name)
            if fresh is None:
                self.forget_job(key)
                return None
            self.jobs[key] = fresh
            if _rv(fresh) == _rv(body):
                # Not a lagging cache: the stored status itself is behind its pods (restored
                # from a backup, edited by hand). Never spin; say so and look again later.
                log.warning("%s/%s: %s; waiting for the status or the pods to change", namespace, name, stale)
                return 30.0
            return 0
        await self._progress(key, job, decision, pods)
        try:
            await self._apply(key, job, body, decision)
        except Conflict:
            fresh = await self.kube.get_job(namespace, name)
            if fresh is None:
                self.forget_job(key)
                return None
            self.jobs[key] = fresh
            return 0
        return decision.requeue_after

    async def _apply(self, key: Key, job: TrainingJob, body: dict[str, Any], decision: Decision) -> None:
        namespace, name = key
        # A status write moves resourceVersion on; the cached body itself stays untouched.
        body = {**body, "metadata": dict(body["metadata"])}
        uid = body["metadata"]["uid"]
        previous = TrainingJobStatus.model_validate(body.get("status") or {})
        new_status = decision.status.wire()
        changed = new_status != previous.wire()
        committed = decision.commit_first and changed
        if committed:
            await self._write_status(key, body, new_status)
            changed = False
        await asyncio.gather(*(self._delete(namespace, pod, pod_uid) for pod, pod_uid in decision.delete_pods))
        try:
            await self._create(key, job, uid, decision)
        except Invalid as error:
            # A pod the API server refuses (an admission policy, an invalid field the schema
            # could not catch) will be refused again: fail the job, loudly.
            message = f"the API server refused a pod: {error}"[:1024]
            # Not from an uncommitted decision: that one counted the refused pods as created.
            failed = (decision.status if committed else previous).model_copy(deep=True)
            failed.observed_generation = job.metadata.generation
            now = datetime.now(UTC).replace(microsecond=0)
            set_condition(failed, "Failed", True, "PodCreationFailed", message, now, job.metadata.generation)
            failed.completion_time = now
            failed.phase = derive_phase(failed)
            await self._write_status(key, body, failed.wire())
            await self.kube.post_event(body, "Warning", "PodCreationFailed", message)
            log.warning("%s/%s PodCreationFailed: %s", namespace, name, message)
            metrics.FINISHED.labels("PodCreationFailed").inc()
            return
        if changed:
            await self._write_status(key, body, new_status)
        for event in decision.events:
            await self.kube.post_event(body, event.type, event.reason, event.message)
            log.info(
                "%s/%s %s: %s",
                namespace,
                name,
                event.reason,
                event.message,
                extra={"job": f"{namespace}/{name}", "reason": event.reason, "attempt": decision.status.attempt},
            )
            if event.reason == "GangRestart":
                metrics.RESTARTS.labels((decision.status.failures or [])[-1].reason).inc()
            elif event.reason == "Created" and decision.status.attempt == 0:
                created = parse_time(body["metadata"].get("creationTimestamp"))
                if created is not None:
                    metrics.TIME_TO_CREATED.observe((datetime.now(UTC) - created).total_seconds())
            elif decision.status.completion_time is not None and event.reason in (
                "AllNodesSucceeded",
                "BackoffLimitExceeded",
                "DeadlineExceeded",
                "Unschedulable",
            ):
                metrics.FINISHED.labels(event.reason).inc()
        self.phases[key] = decision.status.phase or "Pending"
        self._count_phases()
        if decision.delete_job:
            log.info("%s/%s: ttlSecondsAfterFinished passed; deleting the job", namespace, name)
            await self.kube.delete_job(namespace, name, uid)

    async def _write_status(self, key: Key, body: dict[str, Any], status: dict[str, Any]) -> None:
        written = await self.kube.replace_status(body, status)
        if written is not None:
            self.remember_job(written)
            body["metadata"]["resourceVersion"] = written["metadata"]["resourceVersion"]

    async def _delete(self, namespace: str, pod: str, uid: str) -> None:
        if uid in self.deleting:
            return
        await self.kube.delete_pod(namespace, pod, uid)
        self.deleting.add(uid)

    async def _create(self, key: Key, job: TrainingJob, uid: str, decision: Decision) -> None:
        namespace = key[0]
        if not decision.create_service and not decision.create_ranks:
            return
        objects = [] if not decision.create_service else [render_service(job, namespace, uid)]
        objects += [
            render_pod(job, namespace, uid, rank, decision.status.attempt, self.settings.render)
            for rank in decision.create_ranks
        ]
        results = await asyncio.gather(*(self.kube.create(obj) for obj in objects))
        for obj, created in zip(objects, results, strict=True):
            if obj["kind"] == "Service":
                self.created_services.add(key)
            elif created is not None:
                self.created_pods.setdefault(key, {})[created["metadata"]["uid"]] = (time.monotonic(), created)

    # --- progress -----------------------------------------------------------------------
    async def _progress(self, key: Key, job: TrainingJob, decision: Decision, pods: list[PodView]) -> None:
        """Fold rank 0's newest metrics into the status (at most every progress interval)."""
        status = decision.status
        finishing = status.completion_time is not None and (job.status is None or job.status.completion_time is None)
        if status.phase not in ("Running", "Restarting") and not finishing:
            return
        interval = self.settings.progress_interval_seconds
        decision.requeue(interval)
        loop = asyncio.get_running_loop()
        if not finishing and loop.time() - self.progress_read.get(key, -interval) < interval:
            return
        rank0 = next(
            (p for p in pods if p.rank == 0 and p.phase != "Pending" and not p.terminating),
            None,
        )
        if rank0 is None:
            return
        self.progress_read[key] = loop.time()
        try:
            text = await self.log_source(key[0], rank0.name)
        except Exception as error:  # no kubelet yet, log rotated, pod gone: try next time
            log.debug("reading the log of %s/%s failed: %s", key[0], rank0.name, error)
            return
        status.progress, status.last_checkpoint = records.fold(text, status.progress, status.last_checkpoint)


# --- kopf wiring ----------------------------------------------------------------------------

OPERATOR: Operator | None = None
CHILD_LABELS = {naming.LABEL_JOB: kopf.PRESENT}


def setup(settings: OperatorSettings, kube: Kube, log_source: LogSource | None = None) -> Operator:
    global OPERATOR
    tail = settings.progress_tail_lines
    OPERATOR = Operator(
        settings=settings,
        kube=kube,
        log_source=log_source or (lambda namespace, pod: kube.read_log(namespace, pod, tail)),
    )
    return OPERATOR


def _operator() -> Operator:
    if OPERATOR is None:
        raise kopf.PermanentError("the operator was not set up (kubetrain.operator.handlers.setup)")
    return OPERATOR


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # kopf's own bookkeeping, should a change handler ever be added, lives under our prefix.
    settings.persistence.finalizer = f"{naming.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=naming.GROUP, key="last-handled-configuration"
    )
    # Events are posted by kube.py for condition transitions only; kopf would post one per
    # handler log line.
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    # With exact namespaces there is nothing to discover cluster-wide (and a namespaced Role
    # cannot grant the CRD/namespace lists kopf would retry for about a minute).
    namespaces = _operator().settings.namespaces
    settings.scanning.disabled = bool(namespaces) and not any(c in n for n in namespaces for c in "*?[")
    # kopf waits this long for more events of an object before handling the newest: 0.1 s
    # by default, all of it added to a new job's time-to-pods. The handlers only enqueue,
    # and the queue coalesces bursts itself.
    settings.batching.batch_window = 0.01


@kopf.index("", "v1", "pods", labels=CHILD_LABELS)
async def pods_by_job(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], dict[str, Any]]:
    return {(namespace, labels[naming.LABEL_JOB]): _to_dict(body)}


@kopf.index("", "v1", "services", labels=CHILD_LABELS)
async def services_by_job(
    namespace: str | None, labels: Mapping[str, str], name: str, **_: Any
) -> dict[tuple[str | None, str], str]:
    return {(namespace, labels[naming.LABEL_JOB]): name}


def _with_indices(kwargs: dict[str, Any]) -> Operator:
    operator = _operator()
    # kopf hands the same live Index objects to every handler; keep them for the queue.
    operator.pods_index, operator.services_index = kwargs["pods_by_job"], kwargs["services_by_job"]
    return operator


@kopf.on.event(naming.GROUP, naming.VERSION, naming.PLURAL)
async def trainingjob_event(type: str, body: kopf.Body, namespace: str | None, name: str, **kwargs: Any) -> None:
    operator = _with_indices(kwargs)
    key = (namespace or "", name)
    if type == "DELETED":
        operator.forget_job(key)
        return
    operator.remember_job(_to_dict(body))
    operator.queue.add(key)


@kopf.on.event("", "v1", "pods", labels=CHILD_LABELS)
async def pod_event(
    type: str, body: kopf.Body, namespace: str | None, labels: Mapping[str, str], **kwargs: Any
) -> None:
    operator = _with_indices(kwargs)
    key = (namespace or "", labels[naming.LABEL_JOB])
    if type == "DELETED":
        operator.pod_gone(key, body.metadata.uid or "")
    if key in operator.jobs:
        operator.queue.add(key)


@kopf.on.event("", "v1", "services", labels=CHILD_LABELS)
async def service_event(type: str, namespace: str | None, labels: Mapping[str, str], **kwargs: Any) -> None:
    operator = _with_indices(kwargs)
    key = (namespace or "", labels[naming.LABEL_JOB])
    if type == "DELETED":
        operator.created_services.discard(key)
    if key in operator.jobs:
        operator.queue.add(key)


def _to_dict(body: Mapping[str, Any]) -> dict[str, Any]:
    # Each watch event is freshly parsed JSON that kopf never mutates, so a shallow copy is
    # a stable snapshot; a deep copy of every pod was a fifth of the operator's CPU when 50
    # jobs arrived at once.
    return dict(body)
