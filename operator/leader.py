"""Leader election on a coordination.k8s.io/v1 Lease: of the operator processes running, one
reconciles and writes; the others are hot standbys whose caches stay warm (docs/operator-ha.md).

Why our own elector:
  * kopf's peering elects through its own KopfPeering objects (a CRD and cluster RBAC of its
    own), and a lower-priority operator only pauses: it is not a Lease, and neither kubectl nor
    the anchors' tooling (controller-runtime, client-go) reads it.
  * The kubernetes client's `leaderelection` runs in threads with blocking calls and wall-clock
    deadlines, elects once (a leader that lost the Lease never stands again), and cannot
    release the Lease: a candidate waits out the full duration after a rolling update.
So this is client-go's algorithm (tryAcquireOrRenew, ReleaseOnCancel) on kopf's event loop,
through kube.py's aiohttp session, plus two things client-go leaves to its callers:
  * a fence: `Elector.leading` is True only until `renew_deadline` after the start of the last
    renewal that succeeded, on the monotonic clock, so a leader that was paused (SIGSTOP, a
    long GC, a frozen VM) and wakes after a successor took over writes nothing, even before
    its renewal loop runs again; kube.py asks it before every write;
  * a watch on the Lease, so a standby sees a released Lease at once and, after a leader
    died, tries again exactly when its Lease expires instead of at the next retry.

Every Lease write is a PUT with the resourceVersion it was read at: of two candidates only
one wins; the other sees 409 and waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp

from kubetrain.operator.kube import ApiError, Kube
from kubetrain.operator.settings import LeaseTiming

log = logging.getLogger("kubetrain.operator")
Callback = Callable[[], None]
WATCH_SECONDS = 300.0


class Leadership(Protocol):
    """What the operator asks of leader election: run it, ask it whether this process leads,
    and at shutdown resign (no write from then on) and then release (a standby may lead)."""

    @property
    def leading(self) -> bool: ...

    async def run(self) -> None: ...

    async def resign(self) -> None: ...

    async def release(self) -> None: ...


class AlwaysLeader:
    """`--no-leader-elect`: this process leads from the start and never steps down (run
    exactly one replica)."""

    def __init__(self, on_started: Callback, on_stopped: Callback) -> None:
        self.on_started, self.on_stopped = on_started, on_stopped
        self._leading = False

    @property
    def leading(self) -> bool:
        return self._leading

    async def run(self) -> None:
        self._leading = True
        self.on_started()
        await asyncio.Event().wait()

    async def resign(self) -> None:
        if self._leading:
            self._leading = False
            self.on_stopped()

    async def release(self) -> None:
        pass


def micro_time(at: datetime) -> str:
    """A metav1.MicroTime."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Observed:
    """A Lease's spec as a candidate saw it, and when it first saw it so (monotonic time): a
    Lease expires `leaseDurationSeconds` after anyone last saw it change, which needs no
    clock shared between machines."""

    spec: dict[str, Any]
    since: float

    @property
    def holder(self) -> str:
        return str(self.spec.get("holderIdentity") or "")

    @property
    def expires(self) -> float:
        return self.since + float(self.spec.get("leaseDurationSeconds") or 0)


def observe(previous: Observed | None, spec: dict[str, Any], now: float) -> Observed:
    """The observation after seeing `spec` at `now`: unchanged specs keep their first sighting."""
    if previous is not None and previous.spec == spec:
        return previous
    return Observed(dict(spec), now)


def may_acquire(observed: Observed, identity: str, now: float) -> bool:
    """Whether `identity` may write itself into the Lease: it holds it already, nobody does
    (released), or the holder let it expire."""
    return observed.holder in ("", identity) or now >= observed.expires


def claimed(spec: dict[str, Any], identity: str, timing: LeaseTiming, at: datetime) -> dict[str, Any]:
    """The Lease's spec with `identity` holding it from `at` (a renewal keeps acquireTime)."""
    renewing = spec.get("holderIdentity") == identity
    transitions = int(spec.get("leaseTransitions") or 0)
    return {
        **spec,
        "holderIdentity": identity,
        # Whole seconds on the wire; rounded up, so the fence's margin only grows.
        "leaseDurationSeconds": max(1, math.ceil(timing.duration)),
        "acquireTime": spec.get("acquireTime") if renewing else micro_time(at),
        "renewTime": micro_time(at),
        "leaseTransitions": transitions if renewing else transitions + 1,
    }


def released(spec: dict[str, Any], at: datetime) -> dict[str, Any]:
    """The Lease given up (client-go's ReleaseOnCancel): no holder, and expired at once for a
    candidate that does not look at the holder."""
    return {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time(at)}


class Elector:
    """One candidate for the Lease `namespace/name`. `run` elects forever: acquire, then renew
    until that fails for `renew_deadline`, then stand again; `on_started`/`on_stopped` are
    called on each change. `resign` then `release` end it and give the Lease back."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming,
        on_started: Callback,
        on_stopped: Callback,
    ) -> None:
        self.kube, self.namespace, self.name, self.identity, self.timing = kube, namespace, name, identity, timing
        self.on_started, self.on_stopped = on_started, on_stopped
        self.observed: Observed | None = None
        self._lease: dict[str, Any] | None = None  # as last read or written
        self._valid_until = 0.0  # monotonic: the fence (see the module's docstring)
        self._is_leader = False
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._resigned: dict[str, Any] | None = None  # the Lease as held when resigning

    @property
    def leading(self) -> bool:
        if not self._is_leader:
            return False
        if asyncio.get_running_loop().time() < self._valid_until:
            return True
        # Asked after the deadline passed, before the renewal loop noticed: step down now, so
        # that the work queue parks what it was doing instead of retrying it.
        self._step_down("the Lease was not renewed within the renew deadline")
        return False

    # --- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        self._task = asyncio.current_task()
        watcher = asyncio.create_task(self._watch())
        try:
            while True:
                await self._acquire()
                await self._renew()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _acquire(self) -> None:
        loop = asyncio.get_running_loop()
        log.info("leader election: %s stands for Lease %s/%s", self.identity, self.namespace, self.name)
        while True:
            worth_trying = self.observed is None or may_acquire(self.observed, self.identity, loop.time())
            if worth_trying and await self._attempt(self.timing.renew_deadline):
                self._is_leader = True
                log.info("leader election: %s leads (Lease %s/%s)", self.identity, self.namespace, self.name)
                self.on_started()
                return
            # Woken early by the watch (a release, a new holder), else when the holder's Lease
            # expires, else after the retry period.
            wait = self.timing.retry_period
            if self.observed is not None and self.observed.holder not in ("", self.identity):
                wait = min(wait, max(0.0, self.observed.expires - loop.time()) + 0.01)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait)

    async def _renew(self) -> None:
        loop = asyncio.get_running_loop()
        while self._is_leader:
            await asyncio.sleep(self.timing.retry_period)
            while self._is_leader:
                remaining = self._valid_until - loop.time()
                if remaining <= 0:
                    self._step_down("the Lease was not renewed within the renew deadline")
                    return
                if await self._attempt(remaining):
                    break
                if self.observed is not None and self.observed.holder not in ("", self.identity):
                    self._step_down(f"{self.observed.holder} holds the Lease")
                    return
                await asyncio.sleep(min(self.timing.retry_period, max(0.0, self._valid_until - loop.time())))

    async def _attempt(self, timeout: float) -> bool:
        """One tryAcquireOrRenew: read the Lease, write ourselves into it if we may. Whether we
        hold it now."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(timeout):
                written = await self._claim(started)
        except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.warning("leader election: Lease %s/%s: %s", self.namespace, self.name, error or "timed out")
            return False
        if written is None:
            return False
        self._lease = written
        self.observed = observe(self.observed, written.get("spec") or {}, loop.time())
        self._valid_until = started + self.timing.renew_deadline
        return True

    async def _claim(self, now: float) -> dict[str, Any] | None:
        lease = await self.kube.get_lease(self.namespace, self.name)
        at = datetime.now(UTC)
        if lease is None:
            spec = claimed({}, self.identity, self.timing, at)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            return await self.kube.create_lease(body)
        self.observed = observe(self.observed, lease.get("spec") or {}, now)
        if not may_acquire(self.observed, self.identity, now):
            return None
        return await self.kube.replace_lease(
            {**lease, "spec": claimed(self.observed.spec, self.identity, self.timing, at)}
        )

    def _step_down(self, why: str, level: int = logging.WARNING) -> None:
        if self._is_leader:
            self._is_leader = False
            self._valid_until = 0.0
            log.log(level, "leader election: %s stops leading: %s", self.identity, why)
            self.on_stopped()

    async def _watch(self) -> None:
        """Keep `observed` current and wake the candidate loop on every change of the Lease."""
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            try:
                async for event in self.kube.watch_lease(self.namespace, self.name, WATCH_SECONDS):
                    failures = 0
                    spec = (event.get("object") or {}).get("spec") or {}
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self.observed = observe(self.observed, spec, loop.time())
                    elif event.get("type") == "DELETED":
                        self.observed = None
                    self._changed.set()
                continue
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as error:
                # Said once per run of failures: without the watch a standby still takes over,
                # only later (it sees an expiry by reading the Lease every retry period).
                level = logging.WARNING if failures == 0 else logging.DEBUG
                log.log(level, "leader election: watching Lease %s/%s failed: %s", *self._where(), error)
                failures += 1
            await asyncio.sleep(self.timing.retry_period)

    # --- shutdown -------------------------------------------------------------------------------
    async def resign(self) -> None:
        """Stop electing and stop leading: from here on this process writes nothing (the Lease
        is still held, so nobody else does either, until `release`)."""
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._is_leader:
            self._resigned = self._lease
        self._step_down("the operator is stopping", logging.INFO)

    async def release(self) -> None:
        """Give the Lease back (after `resign`), so a standby takes over at once instead of
        after the lease duration."""
        lease, self._resigned = self._resigned, None
        if lease is None:
            return
        try:
            async with asyncio.timeout(self.timing.retry_period):
                done = await self.kube.replace_lease(self._released(lease))
                if done is None:
                    # Changed since it was read. Only this process may write a Lease it holds, so
                    # that was its own renewal, cut by the resignation after the server applied it
                    # and before its answer was read (seen in CI, mid-burst): release the Lease as
                    # it is now, if it is still ours.
                    current = await self.kube.get_lease(self.namespace, self.name)
                    if current is not None and (current.get("spec") or {}).get("holderIdentity") == self.identity:
                        done = await self.kube.replace_lease(self._released(current))
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            log.warning(
                "leader election: releasing Lease %s/%s failed (%s); it expires by itself", *self._where(), error
            )
            return
        if done is not None:
            log.info("leader election: %s released Lease %s/%s", self.identity, *self._where())
        else:
            log.warning("leader election: Lease %s/%s changed hands before its release", *self._where())

    @staticmethod
    def _released(lease: dict[str, Any]) -> dict[str, Any]:
        return {**lease, "spec": released(lease.get("spec") or {}, datetime.now(UTC))}

    def _where(self) -> tuple[str, str]:
        return self.namespace, self.name
