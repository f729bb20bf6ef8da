"""The TrainingJobs' pods and Services: listed, then watched straight into the controller.

kopf watched them until issue 15: per event it wakes (or starts) a worker task per object,
batches, builds a Body and a logger, and runs the handlers; with 200 jobs x 4 nodes arriving
at once that was 41 % of the operator's CPU (benchmarks/results/operator_profile.json). Here
an event is one JSON decode, one cache update and, when what the cache keeps changed, a call of
the controller's pod_changed/service_changed (which skips what it expected: its own creations).
kopf still owns the TrainingJob watch.

The cache (`Index`, by (namespace, job)) is filled by a list in kopf's startup handler, which
kopf finishes before it watches TrainingJobs: a restarted operator never mistakes "not in my
cache yet" for "missing" (which would recreate single pods of a running gang). Then a watch
from the list's resourceVersion, resumed from the newest one seen (bookmarks keep it recent)
whenever the server ends it, and a fresh list where that version is too old (410 Gone): what
client-go's reflector does.

Namespaces: each named one is listed and watched on its own (a namespaced Role suffices);
none, or any glob pattern among them, means one cluster-wide watch (filtered by the globs).
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import aiohttp

from kubetrain.api import naming
from kubetrain.operator.kube import ApiError, Kube

log = logging.getLogger("kubetrain.operator")
Key = tuple[str, str]  # (namespace, job name)
Extract = Callable[[dict[str, Any]], Any]  # an object -> what the cache keeps of it
Notify = Callable[[Key, str, Any], None]  # (its job, its uid, what the cache keeps of it; None: gone from that job)
SELECTOR = naming.LABEL_JOB  # every child carries it: the label's presence selects them
PAGE = 500
WATCH_SECONDS = 300.0
RETRY_SECONDS = 1.0  # after a failed watch request (apiserver restarting, network)


class Index(Mapping[Key, Collection[Any]]):
    """What the cache keeps of each child, by its job; a job without children is absent."""

    def __init__(self) -> None:
        self._by_job: dict[Key, dict[str, Any]] = {}
        self._job_of: dict[str, Key] = {}

    def __getitem__(self, key: Key) -> Collection[Any]:
        return self._by_job[key].values()

    def __iter__(self) -> Iterator[Key]:
        return iter(self._by_job)

    def __len__(self) -> int:
        return len(self._by_job)

    def put(self, key: Key, uid: str, value: Any) -> Key | None:
        """Keep `value`; the job the child belonged to before, if it was relabelled."""
        previous = self.drop(uid) if self._job_of.get(uid, key) != key else None
        self._by_job.setdefault(key, {})[uid] = value
        self._job_of[uid] = key
        return previous

    def drop(self, uid: str) -> Key | None:
        key = self._job_of.pop(uid, None)
        if key is not None:
            children = self._by_job[key]
            del children[uid]
            if not children:
                del self._by_job[key]
        return key

    def holds(self, key: Key, uid: str, value: Any) -> bool:
        """Whether the cache keeps exactly `value` for this child of `key` already."""
        return self._job_of.get(uid) == key and self._by_job[key][uid] == value

    def uids(self, namespace: str | None) -> set[str]:
        return {uid for uid, key in self._job_of.items() if namespace is None or key[0] == namespace}


def scopes(namespaces: Collection[str]) -> tuple[list[str | None], Callable[[str], bool]]:
    """What to list and watch for `namespaces` (None: cluster-wide), and which namespaces the
    operator keeps of what that shows (the globs' filter)."""
    globs = [n for n in namespaces if any(c in n for c in "*?[")]
    if not globs:
        return ([None] if not namespaces else list(namespaces)), bool
    return [None], lambda namespace: any(fnmatch.fnmatchcase(namespace, n) for n in namespaces)


async def list_all(kube: Kube, path: str, query: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    """Every item of a list, `PAGE` per request, and the resourceVersion of the one snapshot
    that the pages of a paginated list share."""
    query = {**query, "limit": str(PAGE)}
    items: list[dict[str, Any]] = []
    while True:
        page = await kube.list(path, query)
        items += page.get("items") or []
        more = page["metadata"].get("continue")
        if not more:
            return items, str(page["metadata"]["resourceVersion"])
        query = {**query, "continue": more}


async def list_jobs(kube: Kube, namespaces: Collection[str]) -> list[dict[str, Any]]:
    """The TrainingJobs in the operator's namespaces, listed once at startup: kopf watches them
    afterwards, but says nothing when its first list is done, and readiness means "every job
    that existed is known" (docs/operator-ha.md)."""
    where, admits = scopes(namespaces)
    group = f"/apis/{naming.GROUP}/{naming.VERSION}"
    paths = [f"{group}/{naming.PLURAL}" if s is None else f"{group}/namespaces/{s}/{naming.PLURAL}" for s in where]
    found = await asyncio.gather(*(list_all(kube, path, {}) for path in paths))
    return [job for items, _ in found for job in items if admits(job["metadata"]["namespace"])]


class Informer:
    """One kind of child (`plural`: "pods" or "services") in the operator's namespaces."""

    def __init__(self, kube: Kube, plural: str, namespaces: Collection[str], extract: Extract, notify: Notify) -> None:
        self.kube, self.plural, self.extract, self.notify = kube, plural, extract, notify
        self.scopes, self.admits = scopes(namespaces)
        self.index = Index()
        self.versions: dict[str | None, str] = {}

    def _path(self, scope: str | None) -> str:
        return f"/api/v1/{self.plural}" if scope is None else f"/api/v1/namespaces/{scope}/{self.plural}"

    async def list(self) -> None:
        """Fill (or refill) the cache from every scope; the jobs are told of every change."""
        await asyncio.gather(*(self._list(scope) for scope in self.scopes))

    async def _list(self, scope: str | None) -> None:
        items, self.versions[scope] = await list_all(self.kube, self._path(scope), {"labelSelector": SELECTOR})
        listed: set[str] = set()
        for item in items:
            listed.add(item["metadata"]["uid"])
            self._seen("ADDED", item)
        for uid in self.index.uids(scope) - listed:  # deleted while nobody watched
            key = self.index.drop(uid)
            if key is not None:
                self.notify(key, uid, None)

    async def run(self) -> None:
        """Watch every scope until cancelled (call `list` first)."""
        await asyncio.gather(*(self._watch(scope) for scope in self.scopes))

    async def _watch(self, scope: str | None) -> None:
        while True:
            query = {"labelSelector": SELECTOR, "resourceVersion": self.versions[scope]}
            try:
                async for event in self.kube.watch(self._path(scope), query, WATCH_SECONDS):
                    self._event(scope, event)
                continue  # the server ended the watch (its timeout): resume
            except ApiError as error:
                if error.status == 410:  # too old: as an HTTP status or as an ERROR event
                    log.info("the watch of %s expired; listing them again", self.plural)
                    await self._relist(scope)
                    continue
                failure: Exception = error
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                failure = error
            log.warning("watching %s failed (%s); resuming in %.0f s", self.plural, failure, RETRY_SECONDS)
            await asyncio.sleep(RETRY_SECONDS)

    async def _relist(self, scope: str | None) -> None:
        while True:
            try:
                return await self._list(scope)
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as error:
                log.warning("listing %s failed (%s); again in %.0f s", self.plural, error, RETRY_SECONDS)
                await asyncio.sleep(RETRY_SECONDS)

    def _event(self, scope: str | None, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise ApiError(int(obj.get("code") or 500), json.dumps(obj).encode())
        self.versions[scope] = obj["metadata"]["resourceVersion"]
        if kind != "BOOKMARK":
            self._seen(str(kind), obj)

    def _seen(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        uid, namespace = meta["uid"], meta["namespace"]
        job = (meta.get("labels") or {}).get(naming.LABEL_JOB)
        if kind == "DELETED" or job is None or not self.admits(namespace):
            gone = self.index.drop(uid)
            if gone is not None:
                self.notify(gone, uid, None)
            return
        key, kept = (namespace, job), self.extract(obj)
        if self.index.holds(key, uid, kept):
            return  # changed where the cache keeps nothing (an IP, an annotation): no news
        previous = self.index.put(key, uid, kept)
        if previous is not None:
            self.notify(previous, uid, None)
        self.notify(key, uid, kept)
