"""The log archive's I/O: what operator/archive.py (pure) decides, read and written through
kube.py. Decides nothing.

A reconcile pass calls `archive` (follow the logs of pods being stopped, read and keep the
tails of those that are due), writes the job's status (the archived rank 0 checkpoint records
are folded into it), and only then `release` (the finalizers come off). Every step is safe to
repeat: a pass that dies in between is redone by the next.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob
from kubetrain.operator import archive
from kubetrain.operator.kube import ApiError, Kube, Refused, log_gone
from kubetrain.operator.pods import PodView

log = logging.getLogger("kubetrain.operator")
# A followed log whose container has exited ends at once; its last bytes may still be on their way
# when the exit is reported, so a capture is waited for this long before it is used.
CAPTURE_DRAIN_SECONDS = 5.0
# A pod the operator deletes is deleted once its log stream is open (the kubelet answered; it
# sends the headers before the first line), or after this long: a kubelet that does not answer
# (a lost node) holds the delete back no longer.
CAPTURE_OPEN_SECONDS = 5.0


class Captures:
    """The logs of pods being stopped, followed (pods/log?follow=true) until their containers
    exit, each kept to the last 2 x budget bytes: the fallback when the kubelet has removed a
    container before its log could be read once more."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.texts: dict[str, bytearray] = {}
        self.opened: dict[str, asyncio.Event] = {}
        # Pods (uids) whose tail is kept: a later pass that still sees one (a cache behind the
        # finalizer's removal) releases it without reading its log again. That read goes by
        # name, and may get less than was kept, or the log of the next pod of the same name.
        self.archived: set[str] = set()

    def follow(self, namespace: str, pod: PodView, budget: int) -> asyncio.Event:
        """Follow the pod's log (once per pod): the event is set when the stream is open, or ended."""
        if pod.uid not in self.tasks:
            self.texts[pod.uid] = bytearray()
            self.opened[pod.uid] = asyncio.Event()
            self.tasks[pod.uid] = asyncio.create_task(self._follow(namespace, pod, budget), name=f"capture-{pod.name}")
        return self.opened[pod.uid]

    async def _follow(self, namespace: str, pod: PodView, budget: int) -> None:
        kept, opened = self.texts[pod.uid], self.opened[pod.uid]
        try:
            async for chunk in self.kube.stream_log(namespace, pod.name, archive.tail_lines(budget), opened):
                kept += chunk
                if len(kept) > 2 * budget:
                    del kept[: len(kept) - budget]
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            # The read after the container exits is the archive; this is only its fallback.
            log.debug("following the log of %s/%s failed: %s", namespace, pod.name, error)
        finally:
            opened.set()

    async def finish(self, uid: str, timeout: float = CAPTURE_DRAIN_SECONDS) -> str | None:
        """What was followed of the pod's log, once its stream has ended (the container exited:
        it ends at once) or after `timeout`; None if nothing was."""
        task = self.tasks.get(uid)
        if task is not None and not task.done():
            await asyncio.wait([task], timeout=timeout)
        kept = self.texts.get(uid)
        # A stream opened once the container was gone holds only the kubelet's notice.
        return kept.decode("utf-8", errors="replace") if kept and not log_gone(bytes(kept)) else None

    def drop(self, uid: str) -> None:
        task = self.tasks.pop(uid, None)
        if task is not None:
            task.cancel()
        self.texts.pop(uid, None)
        self.opened.pop(uid, None)


@dataclass
class Archived:
    """What a pass archived: the pods to release once the status is written, the archived logs
    of rank 0 (their checkpoint records go into status.lastCheckpoint), when to look again."""

    release: list[PodView] = field(default_factory=list)
    rank0: list[str] = field(default_factory=list)
    look_again: float | None = None


async def archive_logs(
    kube: Kube,
    captures: Captures,
    job: TrainingJob,
    namespace: str,
    uid: str,
    pods: Sequence[PodView],
    now: datetime,
) -> Archived:
    """Follow the pods being stopped and keep the tails of those that are due, in their attempts'
    ConfigMaps. Raises when the API server cannot be reached (the work queue retries)."""
    todo = archive.plan(pods, uid, now)
    budget = archive.node_budget(job.spec.nodes)
    for pod in todo.capture:
        captures.follow(namespace, pod, budget)
    lines = archive.tail_lines(budget)

    async def tail(pod: PodView) -> tuple[str, bool]:
        """The pod's log tail (read now, else as followed while it stopped), and whether it is one:
        False for the note that says why neither could be had."""
        try:
            return await kube.read_log(namespace, pod.name, lines), True
        except ApiError as error:  # the kubelet has no log for it (any more)
            captured = await captures.finish(pod.uid)
            return (captured, True) if captured else (archive.unreadable(pod, str(error)), False)

    # Errors reaching the API server itself propagate: the work queue tries the pass again.
    due = [pod for pod in todo.archive if pod.uid not in captures.archived]
    tails = await asyncio.gather(*(tail(pod) for pod in due))
    done = Archived(release=[*todo.release, *todo.archive], look_again=todo.look_again)
    read: dict[int, dict[int, str]] = {}
    notes: dict[int, dict[int, str]] = {}
    for pod, (text, found) in zip(due, tails, strict=True):
        attempt, rank = pod.attempt or 0, pod.rank or 0
        (read if found else notes).setdefault(attempt, {})[rank] = text
        if found and rank == 0:
            done.rank0.append(text)
    for attempt in sorted({*read, *notes}):
        await _keep(kube, job, namespace, uid, attempt, read.get(attempt, {}), notes.get(attempt, {}))
    captures.archived.update(pod.uid for pod in due)
    return done


async def follow_before_delete(captures: Captures, job: TrainingJob, namespace: str, pods: Sequence[PodView]) -> None:
    """The operator is about to delete these pods (a gang restart, a suspend, cleanPodPolicy):
    follow the log of each whose trainer has run, and return once every stream is open (or
    CAPTURE_OPEN_SECONDS passed). The kubelet removes a deleted pod's container, and its log,
    as soon as it has stopped: a trainer that exits at once on SIGTERM is gone before a read
    after its exit, or a follow begun when the watch shows the deletion, could reach it."""
    budget = archive.node_budget(job.spec.nodes)
    waits = [asyncio.create_task(captures.follow(namespace, pod, budget).wait()) for pod in pods if pod.has_run]
    if waits:
        _, late = await asyncio.wait(waits, timeout=CAPTURE_OPEN_SECONDS)
        for wait in late:  # its stream goes on; only the wait for it ends
            wait.cancel()


async def archive_in_place(
    kube: Kube, job: TrainingJob, namespace: str, uid: str, pods: Sequence[str], attempt: int
) -> None:
    """An in-place restart moved `pods` (names) on from `attempt`: keep each one's log tail, read
    now, as that attempt's. Its workers have exited and its agent reported the failure; at most
    the next attempt's first lines follow them. A log that cannot be read is only logged: the
    pod keeps it, and its tail is archived again when the pod goes."""
    budget = archive.node_budget(job.spec.nodes)
    ranks = {naming.pod_name(job.name, rank): rank for rank in range(job.spec.nodes)}

    async def tail(name: str) -> str | None:
        try:
            return await kube.read_log(namespace, name, archive.tail_lines(budget))
        except ApiError as error:
            log.warning("%s/%s: the log of %s for attempt %d: %s", namespace, job.name, name, attempt, error)
            return None

    texts = await asyncio.gather(*(tail(name) for name in pods))
    read = {ranks[name]: text for name, text in zip(pods, texts, strict=True) if text is not None and name in ranks}
    await _keep(kube, job, namespace, uid, attempt, read, {})


async def _keep(
    kube: Kube,
    job: TrainingJob,
    namespace: str,
    uid: str,
    attempt: int,
    read: dict[int, str],
    notes: dict[int, str],
) -> None:
    """Write these tails into `attempt`'s archive. A note (a log that could not be had) never
    replaces a tail kept before: a pass redone after the operator died may find the container
    gone whose log it had kept."""
    name = naming.log_archive_name(job.name, attempt)
    data = archive.entries(read, job.spec.nodes)
    if notes:
        existing = await kube.get_configmap(namespace, name)
        ours = existing is not None and _uid(existing) == uid
        kept = set((existing or {}).get("data") or {}) if ours else set()
        data |= {k: v for k, v in archive.entries(notes, job.spec.nodes).items() if k not in kept}
    if not data:
        return
    try:
        created = await kube.create(archive.configmap(job, namespace, uid, attempt, data))
        if created is None and not await kube.json_patch(namespace, "configmaps", name, archive.update(uid, data)):
            log.warning(
                "%s/%s: ConfigMap %s exists and is not this job's archive: the logs of attempt %d are not kept",
                namespace, job.name, name, attempt,
            )  # fmt: skip
            return
    except Refused as refused:
        # RBAC or a quota: the pods must still go; the archive is lost and the log says why.
        log.error(
            "%s/%s: the logs of attempt %d cannot be kept in ConfigMap %s: %s",
            namespace,
            job.name,
            attempt,
            name,
            refused,
        )
        return
    nodes = ", ".join(key.removesuffix(".log") for key in sorted(data))
    log.info("%s/%s: kept the logs of attempt %d (%s) in ConfigMap %s", namespace, job.name, attempt, nodes, name)


def _uid(obj: dict[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(naming.LABEL_JOB_UID)


async def release(kube: Kube, captures: Captures, namespace: str, pods: Sequence[PodView]) -> None:
    """Take kubetrain's finalizer off these pods (a pod gone, or whose finalizers changed since it
    was seen, is left to the next pass its watch event brings)."""

    async def one(pod: PodView) -> None:
        patch = archive.release(pod)
        if patch is not None:
            await kube.json_patch(namespace, "pods", pod.name, patch)
        captures.drop(pod.uid)

    await asyncio.gather(*(one(pod) for pod in pods))


async def release_orphans(
    kube: Kube, captures: Captures, namespace: str, name: str, pods: Sequence[PodView], now: datetime
) -> None:
    """The pods of a TrainingJob this controller does not hold (deleted, being deleted, or not
    seen yet at startup): asked for the job, release those whose job is gone. Nothing is kept:
    the archive would go with the job."""
    if not any(archive.holds(pod) for pod in pods):
        return
    body = await kube.get_job(namespace, name)
    live = body is not None and not body["metadata"].get("deletionTimestamp")
    if not live or body is None:
        await release(kube, captures, namespace, archive.plan(pods, None, now).release)
        return
    # Live: its own reconcile keeps its pods' logs; only another job's of the same name go here.
    uid = body["metadata"]["uid"]
    await release(kube, captures, namespace, [p for p in archive.plan(pods, uid, now).release if p.job_uid != uid])
