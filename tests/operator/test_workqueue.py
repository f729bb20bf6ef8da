"""The per-job queue: one reconcile at a time per job, bursts coalesced, requeues honoured, and
parked while this process does not lead."""

from __future__ import annotations

import asyncio
import logging

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


def test_a_paused_queue_parks_what_it_is_given_and_runs_it_on_resume() -> None:
    """A standby (or a stopping leader) reconciles nothing; on taking over it runs each parked
    job once, however often it was woken meanwhile."""
    runs: list[Key] = []

    async def work(key: Key) -> float | None:
        runs.append(key)
        return None

    async def scenario() -> None:
        queue = WorkQueue(work)
        queue.pause()
        for _ in range(3):
            queue.add(("ns", "a"))
        queue.add(("ns", "b"), delay=0.01)  # a timer firing while paused is parked too
        await asyncio.sleep(0.05)
        assert runs == [] and queue.parked == {("ns", "a"), ("ns", "b")}
        queue.forget(("ns", "b"))  # deleted meanwhile
        queue.resume()
        await asyncio.sleep(0.01)
        assert await queue.drain(1)

    asyncio.run(scenario())
    assert runs == [("ns", "a")]


def test_a_reconcile_failing_after_the_pause_is_parked_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    """A reconcile in flight when leadership was lost fails at kube.py's write gate: that is
    no error to retry (and no traceback in the log), and the next leader runs it."""
    runs: list[Key] = []
    started = asyncio.Event()

    async def work(key: Key) -> float | None:
        runs.append(key)
        started.set()
        await asyncio.sleep(0.02)
        raise RuntimeError("refused: not the leader")

    async def scenario() -> WorkQueue:
        queue = WorkQueue(work)
        queue.add(("ns", "a"))
        await started.wait()
        queue.pause()
        queue.add(("ns", "a"))  # an event during the pause
        assert await queue.drain(1)
        await asyncio.sleep(0.6)  # longer than the first failure's retry backoff
        return queue

    queue = asyncio.run(scenario())
    assert runs == [("ns", "a")] and queue.parked == {("ns", "a")} and not queue.timers
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_drain_says_whether_the_running_reconciles_ended() -> None:
    async def work(key: Key) -> float | None:
        await asyncio.sleep(0.2 if key[1] == "slow" else 0)
        return None

    async def scenario() -> tuple[bool, bool]:
        queue = WorkQueue(work)
        queue.add(("ns", "slow"))
        queue.pause()
        return await queue.drain(0.05), await queue.drain(1)

    assert asyncio.run(scenario()) == (False, True)
