"""The pods' logs a reconcile reads, through kube.py's `pods/log` (as Kueue's, the PodGroup's and
the archive's I/O have their modules, kueue_io, podgroup_io and archive_io):
  * rank 0's tail, for its metrics records: when `progress.due` says a read is due, or when a
    gang failure is decided (`progress.recheck`: rank 0 may have recorded `done` since);
  * a NotReady pod's tail, for its torchrun agents' `failure` record (`progress.held_suspect`):
    the gang failure of an in-place restart;
  * every rank's tail, for the stacks a stall leaves (`forensics.wanted`, `forensics.collect`).
A log that cannot be read (no kubelet yet, rotated, the pod gone) reads as nothing, and the
next pass tries again. What the text means is decided by the pure modules named above.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kubetrain.api import records
from kubetrain.api.contract import stacks_after_seconds
from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.api.records import GangFailure
from kubetrain.operator import forensics, progress, timeline
from kubetrain.operator.decision import Decision
from kubetrain.operator.forensics import RankStacks
from kubetrain.operator.kube import Kube
from kubetrain.operator.pods import PodView

log = logging.getLogger("kubetrain.operator")
LogSource = Callable[[str, str], Awaitable[str]]  # (namespace, pod) -> the log's tail
# How often a NotReady pod's log is read for its torchrun agents' `failure` record until one is
# found (the agents print it once every one of them stopped, within 2 s).
HELD_READ_S = 0.25


@dataclass
class Reads:
    """What one job's log reads remember between reconciles."""

    progress_at: float | None = None  # event-loop time of the last read of rank 0's log
    # The in-place restart: the gang failure the pods' torchrun agents reported (their `failure`
    # record, read from a NotReady pod's log), and when a pod's log was last read for it.
    held: GangFailure | None = None
    held_at: float | None = None


class PodLogs:
    """The reads, from `source` (rank 0's and a NotReady pod's tail) and `stacks_source` (every
    rank's, longer); both default to kube.py's `pods/log`."""

    def __init__(
        self, kube: Kube, tail: int, source: LogSource | None = None, stacks_source: LogSource | None = None
    ) -> None:
        self.source = source or (lambda namespace, pod: kube.read_log(namespace, pod, tail))
        self.stacks_source = stacks_source or (
            lambda namespace, pod: kube.read_log(namespace, pod, forensics.TAIL_LINES)
        )

    async def progress(
        self,
        namespace: str,
        reads: Reads,
        job: TrainingJob,
        decision: Decision,
        pods: list[PodView],
        interval: float,
    ) -> None:
        """Fold rank 0's newest records into the decided status when a read is due."""
        loop = asyncio.get_running_loop()
        since = None if reads.progress_at is None else loop.time() - reads.progress_at
        pod, requeue = progress.due(job.status, decision.status, pods, since, interval)
        if requeue is not None:
            decision.requeue(requeue)
        if pod is not None and (text := await self.read(namespace, pod, reads)):
            status = progress.fold(decision.status, text)
            line = status.timeline
            if line is not None and line.attempt == status.attempt:
                # Rank 0's milestones end phases: its phases and waitingOn follow in this write.
                current = [p for p in pods if p.attempt == status.attempt and not p.terminating]
                status.timeline = timeline.advance(line, current, job.spec.nodes)
            decision.status = status
            if (found := records.gang_failure(text, status.attempt)) is not None:
                reads.held = found  # the periodic read found what a NotReady pod would have told
                decision.requeue(0)

    async def holding(
        self, namespace: str, reads: Reads, job: TrainingJob, pods: list[PodView]
    ) -> tuple[list[PodView], float | None]:
        """The pods, the gang failure their torchrun agents hold attached (progress.holding), and
        when to look again (None: no need). A pod that turned NotReady while its attempt runs
        (progress.held_suspect) has its log read for the agents' `failure` record, every
        HELD_READ_S at most while none is found."""
        attempt = job.status.attempt if job.status else 0
        if reads.held is not None and reads.held.attempt != attempt:
            reads.held = None
        suspect = progress.held_suspect(job.status, pods)
        loop = asyncio.get_running_loop()
        again = None
        if suspect is not None and reads.held is None:
            if reads.held_at is None or loop.time() - reads.held_at >= HELD_READ_S:
                reads.held_at = loop.time()
                text = await self.read(namespace, suspect)
                reads.held = records.gang_failure(text or "", attempt)
            if reads.held is None:
                again = HELD_READ_S
        return progress.holding(pods, reads.held), again

    async def rank0(self, namespace: str, reads: Reads, pods: list[PodView]) -> str | None:
        pod = progress.rank0(pods)
        return None if pod is None else await self.read(namespace, pod, reads)

    async def stacks(self, namespace: str, job: TrainingJob, pods: list[PodView]) -> dict[int, RankStacks]:
        """Every rank's stacks, from the log tails of the attempt's pods (read at once)."""
        hang = job.spec.run_policy.hang_timeout_seconds or 0
        ours = [p for p in pods if p.rank is not None and p.attempt == (job.status or TrainingJobStatus()).attempt]

        async def tail(pod: PodView) -> tuple[int, str]:
            try:
                return pod.rank or 0, await self.stacks_source(namespace, pod.name)
            except Exception as error:  # a pod without a readable log wrote no stacks we can see
                log.debug("reading the stacks in %s/%s failed: %s", namespace, pod.name, error)
                return pod.rank or 0, ""

        logs = dict(await asyncio.gather(*(tail(p) for p in ours)))
        return forensics.collect(logs, job.spec.procs_per_node, stacks_after_seconds(hang))

    async def read(self, namespace: str, pod: str, progress_of: Reads | None = None) -> str | None:
        """The tail of the pod's log, None when it cannot be read; `progress_of`: this is that
        job's read of rank 0's records (progress.due counts from it)."""
        if progress_of is not None:
            progress_of.progress_at = asyncio.get_running_loop().time()
        try:
            return await self.source(namespace, pod)
        except Exception as error:  # no kubelet yet, log rotated, pod gone: try next time
            log.debug("reading the log of %s/%s failed: %s", namespace, pod, error)
            return None
