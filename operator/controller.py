"""The controller: one cache object per job, and reconcile = observe -> decide -> apply.

observe: the job's pods and Service from the informer's indices (operator/informer.py;
listed before any TrainingJob is seen, so a restarted operator never mistakes "not in my
cache yet" for "missing"), overlaid with the job's expectations: what this controller created or deleted
whose watch events have not arrived yet (the name and the idea are kube-controller-manager's
ControllerExpectations).
decide: pure functions — `status.decide` (the gang), `progress` (rank 0's metrics) and
`refusal` (a pod the API server refused). They are the only authors of the job's status.
apply: `kube.py`, the only writer; the status goes first when the decision says so. What
Kueue and the PodGroup APIs need read and written is in `kueue_io.py` and `podgroup_io.py`;
the pods' logs the reconcile reads (rank 0's records, the agents' `failure` record, a stall's
stacks) in `logs_io.py`; the logs of pods being deleted are kept by `archive_io.py` (as
`archive.py` decides) before the status write, and the pods released after it.

Level-based: a reconcile depends on the job's state, never on which event woke it; the
TrainingJob status holds everything that must survive a restart of the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.operator import (
    agent_io,
    archive,
    archive_io,
    forensics,
    kueue,
    kueue_io,
    logs_io,
    metrics,
    podgroup,
    podgroup_io,
    progress,
    refusal,
    timeline,
)
from kubetrain.operator.decision import Decision, Event, Policy, StaleView
from kubetrain.operator.kube import ApiError, Conflict, Kube, Refused
from kubetrain.operator.pods import PodView, parse_time
from kubetrain.operator.render import agent_port, in_place, render_pod, render_service
from kubetrain.operator.settings import OperatorSettings
from kubetrain.operator.status import decide
from kubetrain.operator.workqueue import Key, WorkQueue

log = logging.getLogger("kubetrain.operator")
Index = Mapping[Any, Collection[Any]]  # informer.Index: (namespace, job) -> what it keeps per child
# How long a created pod counts as observed before its watch event arrives: past that the
# pod was gone before it could be listed, and a watch event will never come.
EXPECTATIONS_TIMEOUT_SECONDS = 60.0
# Retries of a transiently refused creation (a missing ServiceAccount, a quota): 1 s doubling to 60 s.
REFUSAL_BACKOFF_SECONDS = (1.0, 60.0)


# kubectl apply's copy of the whole manifest: nothing here reads it.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _held(body: dict[str, Any]) -> dict[str, Any]:
    """The job as the controller keeps it: without managedFields and kubectl's last-applied
    copy, which together are larger than the spec and status the reconcile reads."""
    meta = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
    if LAST_APPLIED in (meta.get("annotations") or {}):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != LAST_APPLIED}
    return {**body, "metadata": meta}


def _rv(body: dict[str, Any]) -> int:
    try:
        return int(body["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1


@dataclass
class Expectations:
    """Writes of this controller its watches have not shown yet. Pods are tracked by uid (as in
    client-go's UIDTrackingControllerExpectations): a reconcile that runs before the watch
    event of a pod it created must count it, and one that runs before a deletion finishes
    must treat the pod as terminating."""

    creations: dict[str, tuple[float, PodView]] = field(default_factory=dict)
    service: bool = False
    deletions: set[str] = field(default_factory=set)
    moved: dict[str, int] = field(default_factory=dict)  # uid -> the attempt a living pod was relabelled to

    def created(self, pod: dict[str, Any]) -> None:
        view = PodView.from_pod(pod)
        self.creations[view.uid] = (time.monotonic(), view)

    def pods(self, indexed: Collection[PodView]) -> list[PodView]:
        """The indexed pods plus the created ones not indexed yet."""
        seen = {p.uid: p for p in indexed}
        for uid in [uid for uid in self.creations if uid in seen]:
            del self.creations[uid]
        for uid in [
            uid for uid, attempt in self.moved.items() if uid not in seen or (seen[uid].attempt or 0) >= attempt
        ]:
            del self.moved[uid]
        views = [*seen.values(), *(view for _, view in self.creations.values())]
        views = [replace(p, attempt=self.moved[p.uid], ready=False) if p.uid in self.moved else p for p in views]
        return [replace(p, terminating=True) if p.uid in self.deletions else p for p in views]

    def confirmed(self, view: PodView) -> bool:
        """Whether the watch shows a pod exactly as this controller created it: then the view a
        reconcile reads is unchanged (the pod moves from here to the index) and none is due."""
        entry = self.creations.get(view.uid)
        if entry is None or entry[1] != view:
            return False
        del self.creations[view.uid]
        return True

    def gone(self, uid: str) -> None:
        self.deletions.discard(uid)
        self.creations.pop(uid, None)
        self.moved.pop(uid, None)

    def overdue(self, indexed: Collection[PodView]) -> list[PodView]:
        """Created pods the watch has not shown for EXPECTATIONS_TIMEOUT_SECONDS."""
        seen = {p.uid for p in indexed}
        horizon = time.monotonic() - EXPECTATIONS_TIMEOUT_SECONDS
        return [view for at, view in self.creations.values() if at < horizon and view.uid not in seen]


@dataclass
class JobState:
    """Everything the controller keeps about one job between reconciles."""

    body: dict[str, Any]  # the newest TrainingJob seen (by resourceVersion)
    expectations: Expectations = field(default_factory=Expectations)
    reads: logs_io.Reads = field(default_factory=logs_io.Reads)  # its pods' logs: when read, what they held
    phase: str | None = None  # as last written, for the jobs-by-phase gauge
    refusals: int = 0  # creation passes refused in a row: the retry backoff's exponent
    placement: kueue_io.Placed | None = None  # Kueue flavors read, and where they place
    # Whether the in-place job's agent token Secret (operator/agent_io.py) was created (or found);
    # None: not tried by this process (the pods may predate it), False: refused.
    agent_secret: bool | None = None
    # An elastic job's PodGroup minCount as this process last wrote it (or saw it need no write).
    group_min: int | None = None


def _count_phase(state: JobState, phase: str | None) -> None:
    """Move the job between the jobs-by-phase gauge's series (None: out of all of them); a
    count kept by steps, not a sum over every job on every reconcile."""
    if phase != state.phase:
        if state.phase is not None:
            metrics.JOBS.labels(state.phase).dec()
        if phase is not None:
            metrics.JOBS.labels(phase).inc()
        state.phase = phase


def _observe_timeline(body: dict[str, Any], previous: TrainingJobStatus, status: TrainingJobStatus) -> None:
    """The start-up histograms, once per attempt: when its first step is first recorded."""
    line, before = status.timeline, previous.timeline
    if line is None or line.first_step_at is None:
        return
    if before is not None and before.attempt == line.attempt and before.first_step_at is not None:
        return
    if line.start == "Start":
        created = parse_time(body["metadata"].get("creationTimestamp"))
        if created is not None:
            metrics.TIME_TO_FIRST_STEP.observe(max((line.first_step_at - created).total_seconds(), 0.0))
    elif (seconds := timeline.seconds(line)) is not None:
        metrics.RECOVERY.labels(line.start).observe(max(seconds, 0.0))


class Controller:
    """The jobs this operator process knows, their work queue, and the reconcile."""

    def __init__(
        self,
        settings: OperatorSettings,
        kube: Kube,
        log_source: logs_io.LogSource | None = None,
        stacks_source: logs_io.LogSource | None = None,
    ) -> None:
        self.settings = settings
        self.agent_key = agent_io.operator_key()  # signs the in-place restarts' orders
        self.policy = Policy(
            stuck_timeout=timedelta(seconds=settings.stuck_timeout_seconds),
            straggler_timeout=timedelta(seconds=settings.straggler_timeout_seconds),
        )
        self.kube = kube
        self.logs = logs_io.PodLogs(kube, settings.progress_tail_lines, log_source, stacks_source)
        self.jobs: dict[Key, JobState] = {}
        self.pods: Index = {}
        self.services: Index = {}
        self.queue = WorkQueue(self.reconcile)
        # A process reconciles nothing until it leads (operator/leader.py): it only keeps its
        # caches, parking in the queue what it would have reconciled.
        self.queue.pause()
        # Every job and child that existed is in the caches (handlers.py lists them): /readyz.
        self.synced = False
        # At most `workers` jobs create their children at once, served in arrival order (the
        # semaphore is FIFO). 200 new jobs creating at once share the API server's throughput,
        # so each gets its last pod near the end of the burst; a few at a time finish one
        # after another at the same throughput. Only the creates are bounded: the status
        # write and the Event after them need no turn.
        self.creating = asyncio.Semaphore(settings.workers)
        self.discovery = podgroup_io.Discovery(kube)
        self.captures = archive_io.Captures(kube)

    # --- leadership (operator/leader.py) ---------------------------------------------------
    def lead(self) -> None:
        """This process leads now: reconcile every job it knows (a standby reconciled nothing,
        and its predecessor may have stopped in the middle of any), then whatever comes."""
        metrics.LEADER.set(1)
        self.queue.parked.update(self.jobs)
        self.queue.resume()

    def follow(self) -> None:
        """Another process leads, or this one is stopping: start no reconcile (the running ones
        finish or fail at kube.py's write gate and are parked)."""
        metrics.LEADER.set(0)
        self.queue.pause()

    # --- what the watches see -----------------------------------------------------------
    def watch(self, pods: Index, services: Index) -> None:
        """The informers' live indices of the children by (namespace, job): PodViews, Service names."""
        self.pods, self.services = pods, services

    def job_seen(self, body: dict[str, Any]) -> None:
        key, newer = self._remember(body)
        # Not newer: the watch echoes a status this controller wrote (and holds since), or an
        # older version; a reconcile has seen this job as it is (client-go's controllers skip
        # an update of the same resourceVersion likewise).
        if newer:
            self.queue.add(key)

    def _remember(self, body: dict[str, Any]) -> tuple[Key, bool]:
        """Keep the newest body; a job recreated under the same name starts a new state.
        Whether the body held changed."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        state = self.jobs.get(key)
        if state is None or state.body["metadata"].get("uid") != body["metadata"].get("uid"):
            if state is not None:
                _count_phase(state, None)
            self.jobs[key] = JobState(_held(body))
        elif _rv(body) > _rv(state.body):
            state.body = _held(body)
        else:
            return key, False
        return key, True

    def job_deleted(self, key: Key) -> None:
        state = self.jobs.pop(key, None)
        if state is not None:
            _count_phase(state, None)
        self.queue.forget(key)

    def pod_changed(self, key: Key, uid: str, view: PodView | None) -> None:
        """The informer's news of one of the job's pods (`view` None: gone from the job)."""
        if view is None:
            self.captures.drop(uid)
        state = self.jobs.get(key)
        if state is None:
            # A job deleted (or not seen yet, at startup): its pods being deleted wait for
            # kubetrain's finalizer to come off (reconcile -> archive_io.release_orphans).
            if view is not None and view.deleted_at is not None and archive.holds(view):
                self.queue.add(key)
            return
        if view is None:
            state.expectations.gone(uid)
        elif state.expectations.confirmed(view):
            return  # the ADDED of a pod this controller created: four per new job, none news
        self.queue.add(key)

    def workload_changed(self, key: Key) -> None:
        if key in self.jobs:
            self.queue.add(key)

    def service_changed(self, key: Key, uid: str, name: str | None) -> None:
        """The informer's news of the job's Service (`name` None: gone). Only its existence is
        read, so the watch showing the one this controller created is no news."""
        state = self.jobs.get(key)
        if state is None:
            return
        if name is None:
            state.expectations.service = False
        elif state.expectations.service:
            return
        self.queue.add(key)

    # --- reconcile ----------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        state = self.jobs.get(key)
        if state is None or state.body["metadata"].get("deletionTimestamp"):
            pods = self.pods.get(key, ())
            await archive_io.release_orphans(self.kube, self.captures, *key, list(pods), datetime.now(UTC))
            return None
        started = time.perf_counter()
        try:
            return await self._reconcile(key, state)
        finally:
            metrics.RECONCILE.observe(time.perf_counter() - started)

    async def _reconcile(self, key: Key, state: JobState) -> float | None:
        body = state.body
        try:
            job = TrainingJob.model_validate(body)
        except ValidationError as error:
            # The CRD schema admits only valid jobs; this is an operator/CRD version skew.
            log.error("%s/%s is not a valid TrainingJob for this operator: %s", *key, error)
            return None
        indexed = self.pods.get(key, ())
        if state.expectations.overdue(indexed):
            await self._confirm_overdue(key[0], body["metadata"]["uid"], state, indexed)
        pods, look_again = await self.logs.holding(key[0], state.reads, job, state.expectations.pods(indexed))
        if look_again is not None:
            self.queue.add(key, look_again)
        service_exists = state.expectations.service or bool(self.services.get(key))
        precise = datetime.now(UTC)  # decide keeps whole seconds but for the timeline
        now = precise.replace(microsecond=0)
        uid = body["metadata"]["uid"]
        policy = replace(self.policy, group_apis=await self.discovery.served())
        try:
            admission = await kueue_io.admission(self.kube, self.settings.render, key[0], uid, job, pods, now)
            # What this pass saw; only the job (its status folded from more logs) and stacks vary.
            decide_now = functools.partial(
                decide,
                uid=uid,
                pods=pods,
                service_exists=service_exists,
                now=precise,
                policy=policy,
                hold=admission.hold,
                admitted=admission.count,
            )
            decision = decide_now(job)
            # decide may run twice more in this pass, each time on more of the pods' logs. Those
            # reads serve only a first decision that ends the attempt, and which one is due depends
            # on what it decided; reading them before every decision would read every rank's log
            # on every pass, for the rare pass that ends an attempt.
            if progress.recheck(job.status, decision.status):
                # A gang failure: rank 0 may have recorded `done` since the last read, which makes
                # it a crash after the job finished, not a restart (progress.py).
                if text := await self.logs.rank0(key[0], state.reads, pods):
                    job = job.model_copy(update={"status": progress.fold(job.status or TrainingJobStatus(), text)})
                    decision = decide_now(job)
                # A stall: every rank's stacks name the one that hung (operator/forensics.py).
                if forensics.wanted(job.status, decision.status):
                    stacks = await self.logs.stacks(key[0], job, pods)
                    decision = decide_now(job, stacks=stacks)
            else:
                interval = self.settings.progress_interval_seconds
                await self.logs.progress(key[0], state.reads, job, decision, pods, interval)
        except StaleView as stale:
            return await self._reread(key, state, stale)
        if admission.retry:
            decision.requeue(kueue_io.WORKLOAD_RETRY_SECONDS)
        kept = await archive_io.archive_logs(self.kube, self.captures, job, key[0], uid, pods, now)
        for text in kept.rank0:  # a checkpoint rank 0 wrote after the last read (on SIGTERM)
            decision.status = progress.fold_checkpoints(decision.status, text)
        if kept.look_again is not None:
            decision.requeue(max(kept.look_again, 1.0))
        # The pods this pass deletes: their logs are followed first, or a fast exit loses them.
        doomed = {uid for _, uid in decision.delete_pods} - state.expectations.deletions
        await archive_io.follow_before_delete(self.captures, job, key[0], [p for p in pods if p.uid in doomed])
        try:
            return await self._apply(key, state, job, decision, admission.flavors, kept.release)
        except Conflict:
            return await self._reread(key, state, None)

    async def _confirm_overdue(self, namespace: str, uid: str, state: JobState, indexed: Collection[PodView]) -> None:
        """Created pods the watch has not shown for a while are asked for, not presumed deleted:
        under load a watch can lag a minute, and a pod taken for deleted restarts the gang."""
        selector = f"{naming.LABEL_JOB_UID}={uid}"
        found = await self.kube.list(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": selector})
        there = {pod["metadata"]["uid"]: pod for pod in found.get("items") or []}
        for view in state.expectations.overdue(indexed):
            if view.uid in there:
                state.expectations.created(there[view.uid])  # the watch is late, not the pod
            else:
                state.expectations.gone(view.uid)

    async def _reread(self, key: Key, state: JobState, stale: StaleView | None) -> float | None:
        """The cached job was out of date (`stale`: its status is behind its pods; else a
        status write conflicted): read it again and reconcile at once."""
        fresh = await self.kube.get_job(*key)
        if fresh is None:
            self.job_deleted(key)
            return None
        if stale is not None and _rv(fresh) == _rv(state.body):
            # Not a lagging cache: the stored status itself is behind its pods (restored
            # from a backup, edited by hand). Never spin; say so and look again later.
            log.warning("%s/%s: %s; waiting for the status or the pods to change", *key, stale)
            return 30.0
        self._remember(fresh)
        return 0

    # --- apply --------------------------------------------------------------------------
    async def _apply(
        self,
        key: Key,
        state: JobState,
        job: TrainingJob,
        decision: Decision,
        flavors: tuple[str, ...] = (),
        release: list[PodView] | None = None,
    ) -> float | None:
        namespace, name = key
        # A status write moves resourceVersion on; the cached body itself stays untouched.
        body = {**state.body, "metadata": dict(state.body["metadata"])}
        previous = TrainingJobStatus.model_validate(body.get("status") or {})
        previous_wire, decided_wire = previous.wire(), decision.status.wire()
        committed = decision.commit_first and decided_wire != previous_wire
        if committed and not await self._write_status(state, body, decided_wire):
            self._gone(key)
            return None
        grace = decision.delete_grace_seconds
        await asyncio.gather(*(self._delete(state, namespace, pod, uid, grace) for pod, uid in decision.delete_pods))
        moves = decision.restart_in_place
        moved = await asyncio.gather(*(self._move(state, namespace, pod, uid, decision) for pod, uid in moves))
        if any(moved):
            # The pods stay, and so do their logs; what the attempt that ended wrote is archived
            # as a deleted pod's would be, so `kubetrain logs --attempt N` reads it either way.
            ended = [pod for (pod, _), done in zip(moves, moved, strict=True) if done]
            job_uid = body["metadata"]["uid"]
            # The order first: reading the logs waits on the kubelet, the agents should not.
            await self._order(state, job, key, ended, decision)
            await archive_io.archive_in_place(self.kube, job, namespace, job_uid, ended, previous.attempt)
        await self._follow_min_count(namespace, state, job, decision)
        created, refused = await self._create(key, state, job, decision, flavors)
        now = datetime.now(UTC).replace(microsecond=0)
        status, events = refusal.settle(previous, decision, committed, refused, created, now)
        # Posted once: with the status that holds them.
        events = [*events, *progress.refusal_events(previous, status), *progress.fallback_events(previous, status)]
        wire = decided_wire if status is decision.status else status.wire()
        if wire != (decided_wire if committed else previous_wire) and not await self._write_status(state, body, wire):
            self._gone(key)
            return None
        await self._announce(key, body, status, events)
        _observe_timeline(body, previous, status)
        # After the status write: a checkpoint found in an archived log is recorded before the
        # pod that logged it can go (an operator that dies before this redoes the archive).
        await archive_io.release(self.kube, self.captures, namespace, release or [])
        _count_phase(state, status.phase or "Pending")
        if decision.delete_job:
            log.info("%s/%s: ttlSecondsAfterFinished passed; deleting the job", namespace, name)
            await self.kube.delete_job(namespace, name, body["metadata"]["uid"])
        return self._requeue(state, decision, refused)

    def _gone(self, key: Key) -> None:
        """The job was deleted under the reconcile. Its watch event comes, unless it was deleted
        between the startup list and kopf's first list (handlers.py): forget it here, or each
        reconcile would recreate pods that the garbage collector removes."""
        self.job_deleted(key)

    def _requeue(self, state: JobState, decision: Decision, refused: refusal.Refusal | None) -> float | None:
        if refused is None or not refused.transient:
            state.refusals = 0
            return None if refused is not None else decision.requeue_after
        low, high = REFUSAL_BACKOFF_SECONDS
        backoff = min(low * 2.0**state.refusals, high)
        state.refusals += 1
        return backoff if decision.requeue_after is None else min(backoff, decision.requeue_after)

    async def _write_status(self, state: JobState, body: dict[str, Any], status: dict[str, Any]) -> bool:
        """Whether it was written: False when the job is gone."""
        written = await self.kube.replace_status(body, status)
        if written is None:
            return False
        if _rv(written) >= _rv(state.body):
            state.body = _held(written)
        body["metadata"]["resourceVersion"] = written["metadata"]["resourceVersion"]
        return True

    async def _move(self, state: JobState, namespace: str, pod: str, uid: str, decision: Decision) -> bool:
        """An in-place restart: relabel the pod to the decided attempt (after the status recorded
        it). Whether this call moved it."""
        attempt = decision.status.attempt
        if state.expectations.moved.get(uid) == attempt:
            return False
        if await self.kube.move_pod(namespace, pod, uid, attempt, decision.status.members):
            state.expectations.moved[uid] = attempt
            return True
        return False

    async def _order(self, state: JobState, job: TrainingJob, key: Key, moved: list[str], decision: Decision) -> None:
        """Order the moved pods' agents to `attempt` (operator/agent_io.py): the relabel's fast
        path, which does not wait for the kubelet to refresh each pod's attempt file."""
        if state.agent_secret is False:  # the pods have no token: they take no order
            return
        token = agent_io.job_token(self.agent_key, key[0], state.body["metadata"]["uid"])
        ips = {p.name: p.ip for p in self.pods.get(key, ())}
        attempt, members = decision.status.attempt, decision.status.members
        targets = [(pod, ips.get(pod)) for pod in moved]
        outcomes = await agent_io.order(targets, agent_port(job), token, attempt, members)
        for pod, outcome in outcomes.items():
            if outcome != "ordered":
                log.warning(
                    "%s/%s: attempt %d not ordered to %s's agent (%s): it waits on its attempt file",
                    *key,
                    attempt,
                    pod,
                    outcome,
                )

    async def _delete(self, state: JobState, namespace: str, pod: str, uid: str, grace: int | None) -> None:
        if uid in state.expectations.deletions:
            return
        await self.kube.delete_pod(namespace, pod, uid, grace)
        state.expectations.deletions.add(uid)

    async def _create(
        self, key: Key, state: JobState, job: TrainingJob, decision: Decision, flavors: tuple[str, ...]
    ) -> tuple[bool, refusal.Refusal | None]:
        """Create the decision's Service and pods (placed on the Kueue `flavors` admitted, joined
        to the attempt's PodGroup): whether any was created (or existed), and the refusal that
        decides the job's fate (a permanent one over a transient one)."""
        namespace, uid, attempt = key[0], state.body["metadata"]["uid"], decision.status.attempt
        members = decision.status.members or ()
        where = kueue.Placement()
        if flavors and decision.create_ranks:
            try:
                state.placement = await kueue_io.placement(self.kube, flavors, state.placement)
                where = state.placement[1]
            except (ApiError, LookupError) as error:
                # Namespaced mode without the grant (docs/scheduling.md, "Kueue"), or a flavor deleted
                # under a live admission: no pod may start off its flavor; retried with backoff.
                message = f"the admitted ResourceFlavors ({', '.join(flavors)}) cannot be read: {error}"
                return False, refusal.Refusal(True, "ResourceFlavorUnreadable", message)
        pods = [
            kueue.place(render_pod(job, namespace, uid, rank, attempt, self.settings.render, members), where)
            for rank in decision.create_ranks
        ]
        if pods and in_place(job) and state.agent_secret is None:  # before the pods, which read it
            token = agent_io.job_token(self.agent_key, namespace, uid)
            state.agent_secret = await agent_io.ensure_secret(self.kube, job, namespace, uid, token)
        api = decision.group_api
        if pods and api is not None:
            blocked = await podgroup_io.create(self.kube, job, namespace, uid, attempt, api)
            if blocked is not None:  # without its PodGroup no pod of the gang could be placed
                return False, blocked
            pods = [podgroup.join(pod, podgroup.podgroup_name(job, attempt), decision.gang_mode) for pod in pods]
        objects = [render_service(job, namespace, uid)] if decision.create_service else []
        objects += pods
        async with self.creating if objects else contextlib.nullcontext():
            results = await asyncio.gather(*(self.kube.create(obj) for obj in objects), return_exceptions=True)
        refusals: list[refusal.Refusal] = []
        errors: list[BaseException] = []
        for obj, result in zip(objects, results, strict=True):
            if isinstance(result, Refused):
                refusals.append(refusal.classify(result.status, result.message))
            elif isinstance(result, BaseException):
                errors.append(result)
            elif obj["kind"] == "Service":
                state.expectations.service = True
            elif result is not None:
                state.expectations.created(result)
        if errors:  # not a refusal (the API server down, a timeout): the work queue retries
            raise errors[0]
        refusals.sort(key=lambda r: r.transient)
        return len(refusals) < len(objects), (refusals[0] if refusals else None)

    async def _follow_min_count(self, namespace: str, state: JobState, job: TrainingJob, decision: Decision) -> None:
        """An elastic job's PodGroup given its minCount once more after spec.elastic.minNodes
        changed (and once after the operator starts), where the version lets it change."""
        if job.spec.elastic is None or state.group_min == job.spec.min_nodes:
            return
        api = decision.group_api
        if api is not None and api.api_version in podgroup.MUTABLE_MIN_COUNT:
            await podgroup_io.follow_min_count(self.kube, job, namespace, api)
        state.group_min = job.spec.min_nodes

    async def _announce(self, key: Key, body: dict[str, Any], status: TrainingJobStatus, events: list[Event]) -> None:
        """Post the events, log them, count them in the metrics."""
        namespace, name = key
        ended = next(
            (c.reason for c in status.conditions or [] if c.type in ("Succeeded", "Failed") and c.status == "True"),
            None,
        )
        for event in events:
            await self.kube.post_event(body, event.type, event.reason, event.message)
            level = logging.WARNING if event.type == "Warning" else logging.INFO
            context = {"job": f"{namespace}/{name}", "reason": event.reason, "attempt": status.attempt}
            log.log(level, "%s/%s %s: %s", namespace, name, event.reason, event.message, extra=context)
            if event.reason == "GangRestart":
                metrics.RESTARTS.labels((status.failures or [])[-1].reason).inc()
            elif event.reason == "Created" and status.attempt == 0:
                created = parse_time(body["metadata"].get("creationTimestamp"))
                if created is not None:
                    metrics.TIME_TO_CREATED.observe((datetime.now(UTC) - created).total_seconds())
            elif event.reason == ended:
                metrics.FINISHED.labels(event.reason).inc()
