"""The children's informer against a scripted fake of kube.py's list and watch: what the cache
holds and whom it tells after a list, each kind of watch event, a server that ends the watch
(resume from the newest version) and one that no longer keeps it (410: list again)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubetrain.api import naming
from kubetrain.operator.informer import Index, Informer
from kubetrain.operator.kube import ApiError

pytestmark = pytest.mark.unit

Event = dict[str, Any]


def child(name: str, job: str | None = "j", namespace: str = "ns", rv: str = "1") -> dict[str, Any]:
    labels = {} if job is None else {naming.LABEL_JOB: job}
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": rv, "labels": labels}
    return {"metadata": meta}


def event(kind: str, obj: dict[str, Any]) -> Event:
    return {"type": kind, "object": obj}


class FakeKube:
    """`pages`: what each list call answers, in order; `watches`: the events (or an exception)
    each watch request yields. Past its script a watch waits to be cancelled."""

    def __init__(self, pages: list[dict[str, Any]], watches: list[list[Event] | Exception]) -> None:
        self.pages, self.watches = pages, watches
        self.listed: list[tuple[str, dict[str, str]]] = []
        self.watched: list[tuple[str, dict[str, str]]] = []
        self.idle = asyncio.Event()

    async def list(self, path: str, query: dict[str, str]) -> dict[str, Any]:
        self.listed.append((path, query))
        return self.pages.pop(0)

    async def watch(self, path: str, query: dict[str, str], timeout: float) -> AsyncIterator[Event]:
        self.watched.append((path, query))
        if not self.watches:
            self.idle.set()
            await asyncio.Event().wait()
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        for item in script:
            yield item


def page(items: list[dict[str, Any]], rv: str, more: str | None = None) -> dict[str, Any]:
    return {"items": items, "metadata": {"resourceVersion": rv, **({"continue": more} if more else {})}}


Told = list[tuple[tuple[str, str], str, str | None]]  # (job, uid, what the cache keeps; None: gone)


def _path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def make(kube: FakeKube, namespaces: tuple[str, ...] = ("ns",)) -> tuple[Informer, Told]:
    told: Told = []
    informer = Informer(
        kube,  # type: ignore[arg-type]
        "pods",
        namespaces,
        lambda obj: obj["metadata"]["name"],
        lambda key, uid, kept: told.append((key, uid, kept)),
    )
    return informer, told


def run(informer: Informer, kube: FakeKube) -> None:
    """List, then watch until the fake's script is spent."""

    async def until_idle() -> None:
        await informer.list()
        task = asyncio.create_task(informer.run())
        await kube.idle.wait()
        task.cancel()

    asyncio.run(until_idle())


def cached(index: Index) -> dict[tuple[str, str], list[str]]:
    return {key: sorted(values) for key, values in index.items()}


def test_a_paginated_list_fills_the_index_and_the_watch_starts_at_its_version() -> None:
    pages = [page([child("a-0", "a")], "7", more="next"), page([child("b-0", "b"), child("x", None)], "7")]
    kube = FakeKube(pages, [])
    informer, told = make(kube)
    run(informer, kube)
    assert cached(informer.index) == {("ns", "a"): ["a-0"], ("ns", "b"): ["b-0"]}
    assert [q.get("continue") for _, q in kube.listed] == [None, "next"]
    assert kube.listed[0][1]["labelSelector"] == naming.LABEL_JOB
    assert kube.watched == [(_path("ns"), {"labelSelector": naming.LABEL_JOB, "resourceVersion": "7"})]
    assert told == [(("ns", "a"), "uid-a-0", "a-0"), (("ns", "b"), "uid-b-0", "b-0")]


def test_watch_events_update_the_index_and_tell_the_jobs() -> None:
    relabelled = child("a-1", "b", rv="13")
    events = [
        event("ADDED", child("a-1", "a", rv="11")),
        event("MODIFIED", child("a-0", "a", rv="12")),  # nothing the cache keeps changed: no news
        event("MODIFIED", relabelled),  # moved to job b: both jobs hear of it
        event("DELETED", child("a-0", "a", rv="14")),
        event("BOOKMARK", {"metadata": {"resourceVersion": "20"}}),
    ]
    kube = FakeKube([page([child("a-0", "a")], "10")], [events])
    informer, told = make(kube)
    run(informer, kube)
    assert cached(informer.index) == {("ns", "b"): ["a-1"]}
    assert told[1:] == [
        (("ns", "a"), "uid-a-1", "a-1"),
        (("ns", "a"), "uid-a-1", None),
        (("ns", "b"), "uid-a-1", "a-1"),
        (("ns", "a"), "uid-a-0", None),
    ]
    # The server ended the watch: the next one resumes from the bookmark, not from the list.
    assert [q["resourceVersion"] for _, q in kube.watched] == ["10", "20"]


def test_a_child_that_loses_its_job_label_is_gone() -> None:
    kube = FakeKube([page([child("a-0", "a")], "1")], [[event("MODIFIED", child("a-0", None, rv="2"))]])
    informer, told = make(kube)
    run(informer, kube)
    assert cached(informer.index) == {} and told[-1] == (("ns", "a"), "uid-a-0", None)


@pytest.mark.parametrize(
    "gone",
    [
        [event("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version: 1 (50)"})],
        ApiError(410, b'{"message": "too old resource version: 1 (50)"}'),
    ],
)
def test_an_expired_watch_lists_again_and_notices_what_was_deleted_meanwhile(gone: list[Event] | Exception) -> None:
    pages = [page([child("a-0", "a"), child("a-1", "a")], "1"), page([child("a-1", "a", rv="60")], "60")]
    kube = FakeKube(pages, [gone])
    informer, told = make(kube)
    run(informer, kube)
    assert cached(informer.index) == {("ns", "a"): ["a-1"]}
    assert (("ns", "a"), "uid-a-0", None) in told
    assert [q["resourceVersion"] for _, q in kube.watched] == ["1", "60"]


@pytest.mark.parametrize(
    "failure", [ApiError(500, b'{"message": "etcd leader changed"}'), TimeoutError(), ValueError("half a line")]
)
def test_a_failed_watch_resumes_from_the_newest_version(monkeypatch: pytest.MonkeyPatch, failure: Exception) -> None:
    monkeypatch.setattr("kubetrain.operator.informer.RETRY_SECONDS", 0.0)
    kube = FakeKube([page([], "5")], [[event("ADDED", child("a-0", "a", rv="6"))], failure])
    informer, _ = make(kube)
    run(informer, kube)
    assert [q["resourceVersion"] for _, q in kube.watched] == ["5", "6", "6"]
    assert cached(informer.index) == {("ns", "a"): ["a-0"]}


@pytest.mark.parametrize(
    ("namespaces", "paths", "admitted"),
    [
        (("a", "b"), [_path("a"), _path("b")], ["a", "b"]),
        ((), ["/api/v1/pods"], ["a", "b", "team-x"]),
        (("team-*",), ["/api/v1/pods"], ["team-x"]),
    ],
)
def test_namespaces_are_watched_one_by_one_unless_a_glob_asks_for_all(
    namespaces: tuple[str, ...], paths: list[str], admitted: list[str]
) -> None:
    def listed(path: str) -> list[dict[str, Any]]:  # what the API server answers for `path`
        namespaces = ("a", "b", "team-x")
        return [child(f"{ns}-0", "j", namespace=ns) for ns in namespaces if path in ("/api/v1/pods", _path(ns))]

    kube = FakeKube([page(listed(path), "1") for path in paths], [])
    informer, _ = make(kube, namespaces)
    asyncio.run(informer.list())
    assert [path for path, _ in kube.listed] == paths
    assert sorted(ns for ns, _ in informer.index) == admitted
