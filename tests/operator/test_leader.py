"""Leader election (operator/leader.py): the pure rules, then candidates on one event loop
against an in-memory Lease API with the API server's optimistic concurrency (a PUT carrying an
old resourceVersion is refused) and its watch. Timings are scaled down ~20x from the defaults.
The same elector against the real API server, with real processes: test_leader_cluster.py."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubetrain.operator.kube import ApiError, Kube, NotLeader
from kubetrain.operator.leader import Elector, Observed, claimed, may_acquire, observe, released
from kubetrain.operator.settings import DEFAULTS, LeaseTiming

pytestmark = pytest.mark.unit

FAST = LeaseTiming(duration=1, renew_deadline=0.6, retry_period=0.1)  # the Lease holds whole seconds
AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


# --- the pure rules -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("holder", "now", "may"),
    [
        ("", 0.0, True),  # released
        ("me", 0.0, True),  # renewing
        ("other", 14.9, False),  # held, not expired
        ("other", 15.0, True),  # expired: 15 s after the spec was first seen as it is
    ],
)
def test_who_may_acquire(holder: str, now: float, may: bool) -> None:
    observed = Observed({"holderIdentity": holder, "leaseDurationSeconds": 15}, since=0.0)
    assert may_acquire(observed, "me", now) is may


def test_expiry_counts_from_the_first_sighting_of_the_spec_not_the_renew_time() -> None:
    """No clock is shared between machines: a Lease expires by the candidate's own clock,
    counted from when it last saw the spec change (client-go does the same)."""
    spec = {"holderIdentity": "other", "leaseDurationSeconds": 15, "renewTime": "1999-01-01T00:00:00.000000Z"}
    first = observe(None, spec, 100.0)
    assert observe(first, dict(spec), 110.0) is first and first.expires == 115.0
    renewed = observe(first, {**spec, "renewTime": "1999-01-01T00:00:02.000000Z"}, 110.0)
    assert renewed.expires == 125.0


def test_a_claim_takes_over_and_a_renewal_keeps_the_acquire_time() -> None:
    held = {
        "holderIdentity": "old",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:01:00.000000Z",
        "leaseTransitions": 4,
    }
    taken = claimed(held, "me", LeaseTiming(), AT)
    assert taken == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-02T03:04:05.678901Z",
        "renewTime": "2026-01-02T03:04:05.678901Z",
        "leaseTransitions": 5,
    }
    later = AT.replace(second=7)
    assert claimed(taken, "me", LeaseTiming(), later) == {
        **taken,
        "renewTime": "2026-01-02T03:04:07.678901Z",
    }


def test_a_release_empties_the_holder_and_shortens_the_duration() -> None:
    spec = claimed({}, "me", LeaseTiming(), AT)
    assert released(spec, AT) == {**spec, "holderIdentity": "", "leaseDurationSeconds": 1}


@pytest.mark.parametrize(("duration", "renew", "retry"), [(15, 15, 2), (15, 10, 10), (15, 10, 0), (10, 15, 2)], ids=str)
def test_timing_that_cannot_work_is_refused_naming_the_flags(duration: float, renew: float, retry: float) -> None:
    with pytest.raises(ValueError, match="--leader-elect-renew-deadline"):
        LeaseTiming(duration=duration, renew_deadline=renew, retry_period=retry)


def test_a_write_without_the_lease_is_refused_before_it_is_sent() -> None:
    sent: list[str] = []

    class Recording(Kube):
        def _session_now(self) -> Any:
            sent.append("request")
            raise AssertionError("nothing may be sent")

    kube = Recording(configuration=None)
    kube.may_write = lambda: False
    with pytest.raises(NotLeader):
        asyncio.run(kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ns", "name": "p"}}))
    assert sent == []


# --- candidates against an in-memory Lease API ------------------------------------------------------
class LeaseApi:
    """One Lease with resourceVersions, and a watch on it. `down` makes every call of the
    candidates named in it fail as a dead connection would."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.changed = asyncio.Condition()
        self.down: set[str] = set()
        self.history: list[tuple[float, str]] = []  # (loop time, holder) after each write

    def client(self, name: str) -> Any:
        return _Client(self, name)

    def _check(self, name: str) -> None:
        if name in self.down:
            raise aiohttp.ClientConnectionError(f"{name}: connection refused")

    async def _store(self, lease: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        lease = copy.deepcopy(lease)
        lease["metadata"]["resourceVersion"] = str(self.version)
        self.lease = lease
        self.history.append((asyncio.get_running_loop().time(), lease["spec"].get("holderIdentity", "")))
        async with self.changed:
            self.changed.notify_all()
        return copy.deepcopy(lease)


class _Client:
    def __init__(self, api: LeaseApi, name: str) -> None:
        self.api, self.name = api, name

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.api._check(self.name)
        return copy.deepcopy(self.api.lease)

    async def create_lease(self, lease: dict[str, Any]) -> dict[str, Any] | None:
        self.api._check(self.name)
        if self.api.lease is not None:
            return None
        return await self.api._store(lease)

    async def replace_lease(self, lease: dict[str, Any]) -> dict[str, Any] | None:
        self.api._check(self.name)
        current = self.api.lease
        if current is None or current["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"]:
            return None  # 409: written since it was read
        return await self.api._store(lease)

    async def watch_lease(self, namespace: str, name: str, timeout: float) -> AsyncIterator[dict[str, Any]]:
        self.api._check(self.name)
        if self.api.lease is not None:
            yield {"type": "ADDED", "object": copy.deepcopy(self.api.lease)}
        while True:
            async with self.api.changed:
                await self.api.changed.wait()
            self.api._check(self.name)
            yield {"type": "MODIFIED", "object": copy.deepcopy(self.api.lease)}


class Candidate:
    """An elector and a record of when it led."""

    def __init__(self, api: LeaseApi, name: str, timing: LeaseTiming = FAST) -> None:
        self.name = name
        self.spans: list[list[float]] = []  # [started, stopped] of each term
        self.elector = Elector(api.client(name), "ns", "lease", name, timing, self._started, self._stopped)
        self.task: asyncio.Task[None] | None = None

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _started(self) -> None:
        self.spans.append([self._now(), float("inf")])

    def _stopped(self) -> None:
        self.spans[-1][1] = self._now()

    def start(self) -> Candidate:
        self.task = asyncio.create_task(self.elector.run())
        return self

    async def kill(self) -> None:
        """As SIGKILL: the loop stops, nothing is released, the process writes nothing more."""
        assert self.task is not None
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task
        if self.spans and self.spans[-1][1] == float("inf"):
            self.spans[-1][1] = self._now()


async def stop(elector: Elector) -> None:
    """A graceful shutdown (handlers.stop): resign, then release."""
    await elector.resign()
    await elector.release()


async def wait_until(check: Any, timeout: float = 5.0) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not check():
        assert loop.time() - start < timeout, "timed out"
        await asyncio.sleep(0.005)
    return loop.time()


def overlapping(candidates: list[Candidate]) -> list[tuple[str, str]]:
    spans = [(c.name, s) for c in candidates for s in c.spans]
    return [
        (a, b) for i, (a, x) in enumerate(spans) for b, y in spans[i + 1 :] if a != b and x[0] < y[1] and y[0] < x[1]
    ]


def test_one_of_three_leads_and_keeps_leading() -> None:
    async def scenario() -> list[Candidate]:
        api = LeaseApi()
        candidates = [Candidate(api, f"c{i}").start() for i in range(3)]
        await asyncio.sleep(FAST.duration * 3)  # several renewals
        leaders = [c for c in candidates if c.elector.leading]
        assert len(leaders) == 1 and len(leaders[0].spans) == 1
        assert api.lease is not None and api.lease["spec"]["holderIdentity"] == leaders[0].name
        assert api.lease["spec"]["leaseTransitions"] == 1
        for c in candidates:
            await stop(c.elector)
        return candidates

    candidates = asyncio.run(scenario())
    assert overlapping(candidates) == []


def test_a_released_lease_is_taken_at_once() -> None:
    """A rolling update: the leader stops gracefully; the standby sees the release through its
    watch and takes over well within one retry period."""

    async def scenario() -> float:
        api = LeaseApi()
        first = Candidate(api, "first").start()
        await wait_until(lambda: first.elector.leading)
        second = Candidate(api, "second").start()
        await asyncio.sleep(FAST.duration * 2)
        assert not second.elector.leading
        await first.elector.resign()  # the shutdown drains its requests in flight here: nobody leads
        await asyncio.sleep(FAST.retry_period * 2)
        assert not first.elector.leading and not second.elector.leading
        assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "first"
        stopped = asyncio.get_running_loop().time()
        await first.elector.release()
        assert api.lease["spec"]["holderIdentity"] == ""
        took = await wait_until(lambda: second.elector.leading) - stopped
        assert overlapping([first, second]) == []
        await stop(second.elector)
        return took

    assert asyncio.run(scenario()) < FAST.retry_period / 2


def test_a_renewal_cut_by_the_resignation_does_not_stop_the_release() -> None:
    """The server applied the leader's last renewal, but the resignation cancelled the loop before
    the answer was read: the Lease it holds in memory is one resourceVersion behind (seen in CI,
    when a graceful stop came mid-burst). The release still gives the Lease back."""

    async def scenario() -> None:
        api = LeaseApi()
        first = Candidate(api, "first").start()
        await wait_until(lambda: first.elector.leading)
        await first.elector.resign()
        assert api.lease is not None
        renewed = copy.deepcopy(api.lease)
        renewed["spec"]["renewTime"] = "2026-11-29T06:00:00.000000Z"
        await api._store(renewed)  # the renewal, written after the elector last read the Lease
        await first.elector.release()
        assert api.lease["spec"]["holderIdentity"] == ""

    asyncio.run(scenario())


def test_a_dead_leaders_lease_is_taken_when_it_expires_not_before() -> None:
    async def scenario() -> tuple[float, float]:
        api = LeaseApi()
        first = Candidate(api, "first").start()
        await wait_until(lambda: first.elector.leading)
        second = Candidate(api, "second").start()
        await asyncio.sleep(FAST.duration * 1.5)
        await first.kill()
        last_renewal = max(t for t, holder in api.history if holder == "first")
        took = await wait_until(lambda: second.elector.leading)
        await stop(second.elector)
        return took - last_renewal, FAST.duration

    after, duration = asyncio.run(scenario())
    assert duration <= after < duration + FAST.retry_period


def test_a_leader_cut_off_from_the_api_server_stops_writing_before_anyone_takes_over() -> None:
    """The fence: the leader that cannot renew stops leading `renew_deadline` after its last
    renewal began, while the standby waits out the whole duration; at no time do two lead."""

    async def scenario() -> tuple[Candidate, Candidate]:
        api = LeaseApi()
        first = Candidate(api, "first").start()
        await wait_until(lambda: first.elector.leading)
        second = Candidate(api, "second").start()
        await asyncio.sleep(FAST.duration)
        api.down.add("first")
        await wait_until(lambda: second.elector.leading)
        assert not first.elector.leading
        api.down.clear()  # back: the old leader stands again, as a standby
        await asyncio.sleep(FAST.duration * 2)
        assert second.elector.leading and not first.elector.leading
        for c in (first, second):
            await stop(c.elector)
        return first, second

    first, second = asyncio.run(scenario())
    assert len(first.spans) == 1 and len(second.spans) == 1
    assert second.spans[0][0] - first.spans[0][1] >= FAST.duration - FAST.renew_deadline - 0.05
    assert overlapping([first, second]) == []


def test_the_fence_closes_on_time_even_when_the_renewal_loop_does_not_run() -> None:
    """A paused process (SIGSTOP, a frozen VM) wakes past its deadline: its first question to
    the fence is answered no, and that steps it down, before any renewal loop runs."""

    async def scenario() -> Candidate:
        api = LeaseApi()
        only = Candidate(api, "only").start()
        await wait_until(lambda: only.elector.leading)
        only.elector._valid_until = asyncio.get_running_loop().time() - 0.001  # as if woken late
        assert not only.elector.leading
        await only.kill()
        return only

    only = asyncio.run(scenario())
    assert len(only.spans) == 1 and only.spans[0][1] < float("inf")


def test_an_api_error_while_standing_is_retried() -> None:
    async def scenario() -> None:
        api = LeaseApi()
        api.down.add("c")
        candidate = Candidate(api, "c").start()
        await asyncio.sleep(FAST.retry_period * 3)
        assert not candidate.elector.leading
        api.down.clear()
        await wait_until(lambda: candidate.elector.leading)
        await stop(candidate.elector)

    asyncio.run(scenario())


def test_errors_of_the_lease_api_are_the_ones_the_elector_survives() -> None:
    """ApiError (a 5xx, a 403) is retried like a dead connection: the loop never dies."""

    class Refusing(_Client):
        async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
            raise ApiError(403, b'{"message": "leases is forbidden"}')

    async def scenario() -> bool:
        api = LeaseApi()
        elector = Elector(Refusing(api, "c"), "ns", "lease", "c", FAST, lambda: None, lambda: None)  # type: ignore[arg-type]
        task = asyncio.create_task(elector.run())
        await asyncio.sleep(FAST.retry_period * 3)
        alive = not task.done()
        task.cancel()
        return alive

    assert asyncio.run(scenario())


def test_the_documented_defaults_are_the_operators() -> None:
    """docs/operator-ha.md's flag table quotes the defaults; they are written in settings.py."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operator-ha.md").read_text()
    rows = {
        cells[0].strip("`"): cells[2]
        for line in doc.splitlines()
        if line.startswith("| `--leader-elect") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    assert rows["--leader-elect/--no-leader-elect"] == ("on" if DEFAULTS.leader_elect else "off")
    assert rows["--leader-elect-resource-name"].startswith(f"`{DEFAULTS.lease_name}`")
    for flag, seconds in (
        ("--leader-elect-lease-duration", DEFAULTS.lease.duration),
        ("--leader-elect-renew-deadline", DEFAULTS.lease.renew_deadline),
        ("--leader-elect-retry-period", DEFAULTS.lease.retry_period),
    ):
        assert rows[flag].startswith(f"{seconds:g} s"), (flag, rows[flag])
