"""The per-job work queue: at most one reconcile of a job at a time, bursts coalesced.

A job must be reconciled when any of its pods changes; four pods created at once are four
watch events but one reconcile, and two reconciles of one job never overlap (they would
decide on the same view twice). Different jobs run concurrently. A reconcile returns when to
look again (a deadline, the next progress read); one that raises is retried with capped
exponential backoff, as client-go's rate-limited workqueue does.

A paused queue (a standby operator, one that lost the leader Lease or is shutting down) runs
nothing: what it is given is parked, and runs when it resumes. A reconcile that was running
when the queue paused and then fails (its writes refused: operator/kube.py's gate) is parked
too, not retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kubetrain.operator import metrics

log = logging.getLogger("kubetrain.operator")
Key = tuple[str, str]  # (namespace, job name)
Work = Callable[[Key], Awaitable[float | None]]


class WorkQueue:
    """At most one reconcile per key at a time; triggers during a run cause one more run."""

    def __init__(self, work: Work) -> None:
        self.work = work
        self.running: set[Key] = set()
        self.dirty: set[Key] = set()
        self.timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.failures: dict[Key, int] = {}
        self.paused = False
        self.parked: set[Key] = set()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        parked, self.parked = self.parked, set()
        for key in parked:
            self.add(key)

    async def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` for the running reconciles (pause first); whether all ended."""
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=timeout)
        return not self.tasks

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
        if self.paused:
            self.parked.add(key)
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
        self.parked.discard(key)

    async def _run(self, key: Key) -> None:
        try:
            while True:
                self.dirty.discard(key)
                try:
                    requeue = await self.work(key)
                    self.failures.pop(key, None)
                except Exception as error:
                    if self.paused:
                        log.debug("reconcile of %s/%s stopped: %s", *key, error)
                        self.parked.add(key)
                        return
                    metrics.RECONCILE_ERRORS.inc()
                    count = self.failures[key] = self.failures.get(key, 0) + 1
                    requeue = min(0.25 * 2**count, 60.0)
                    log.exception("reconcile of %s/%s failed; retrying in %.1f s", *key, requeue)
                if requeue is not None:
                    if requeue <= 0:
                        self.dirty.add(key)
                    else:
                        self.add(key, requeue)
                if key not in self.dirty:
                    return
                if self.paused:
                    self.dirty.discard(key)
                    self.parked.add(key)
                    return
        finally:
            self.running.discard(key)
