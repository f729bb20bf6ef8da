"""The per-job queue: one reconcile at a time per job, bursts coalesced, requeues honoured."""

from __future__ import annotations

import asyncio

import pytest

from kubetrain.operator.workqueue import Key, WorkQueue

pytestmark = pytest.mark.unit


def test_burst_of_triggers_coalesces_into_one_more_run() -> None:
    runs: list[Key] = []
    active = 0
    peak = 0

    async def work(key: Key) -> float | None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        runs.append(key)
        await asyncio.sleep(0.01)
        active -= 1
        return None

    async def scenario() -> None:
        queue = WorkQueue(work)
        for _ in range(20):  # before the run starts: all folded into it
            queue.add(("ns", "a"))
        queue.add(("ns", "b"))
        await asyncio.sleep(0.001)  # the runs have started and read the state
        for _ in range(20):  # e.g. four pods' ADDED events and the status echo
            queue.add(("ns", "a"))
        while queue.running:
            await asyncio.sleep(0.005)

    asyncio.run(scenario())
    assert runs.count(("ns", "a")) == 2 and runs.count(("ns", "b")) == 1
    assert peak == 2  # different jobs in parallel, one job never twice at once


def test_requeue_after_and_failure_backoff() -> None:
    calls: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def work(key: Key) -> float | None:
            calls.append(loop.time() - start)
            if len(calls) == 1:
                return 0.05  # e.g. a deadline due soon
            if len(calls) == 2:
                raise RuntimeError("API down")
            return None

        queue = WorkQueue(work)
        queue.add(("ns", "a"))
        while len(calls) < 3:
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert calls[1] >= 0.05 and calls[2] - calls[1] >= 0.5  # first retry after 0.5 s
