"""What the operator benchmarks share: a fresh control plane with every peer's CRDs, a child
watch that survives the API server dropping it, the API server's own write counts, process
CPU/RSS and the machine's load."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, watch
from peers import Peer
from support import controlplane
from support.waiting import wait_for

WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
RESOURCES = ("pods", "services", "events", "trainingjobs", "pytorchjobs")


@contextlib.contextmanager
def control_plane(crd_dirs: list[Path]) -> Iterator[Any]:
    """A fresh control plane (the tests' binaries) with `crd_dirs` applied and Established."""
    workdir = Path(tempfile.mkdtemp(prefix="kubetrain-bench-"))
    cp = controlplane.start(workdir=workdir / "cp")
    finished = False
    try:
        for crds in crd_dirs:
            cp.kubectl("apply", "--server-side", "-f", str(crds))
            # `kubectl wait` fails outright on a CRD whose status has no conditions yet.
            wait = ("wait", "--for=condition=Established", "--timeout=30s", "-f", str(crds))
            wait_for(lambda wait=wait: cp.kubectl(*wait, check=False).returncode == 0, 90, f"{crds} Established")
        yield cp
        finished = True
    finally:
        cp.stop()
        if finished:  # etcd's data and the logs are only worth keeping when something failed
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"control plane and operator logs kept in {workdir}", file=sys.stderr)


def namespace(cp: Any, name: str) -> None:
    """Create `name` and wait for its default ServiceAccount (pods are refused before it)."""
    with cp.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})

        def has_default_sa() -> bool:
            return any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items)

        wait_for(has_default_sa, 30, f"the default ServiceAccount of {name}")


def server_writes(cp: Any) -> dict[str, float]:
    """apiserver_request_total for writes on the operators' resources, by verb/resource/subresource."""
    text = cp.kubectl("get", "--raw", "/metrics").stdout
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("verb") in WRITE_VERBS and labels.get("resource") in RESOURCES:
            key = f"{labels['verb']} {labels['resource']}" + (
                f"/{labels['subresource']}" if labels.get("subresource") else ""
            )
            counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def settled_writes(cp: Any, before: dict[str, float]) -> dict[str, float]:
    """Write counts since `before`, once they stay the same for 2 s (nothing more in flight)."""
    previous: dict[str, float] = {}
    current = server_writes(cp)
    while current != previous:
        time.sleep(2)
        previous, current = current, server_writes(cp)
    writes = {k: current.get(k, 0.0) - before.get(k, 0.0) for k in current}
    return {k: v for k, v in writes.items() if v}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def rss_mib(pid: int) -> float:
    return round(psutil.Process(pid).memory_info().rss / 2**20, 1)


def machine() -> dict[str, Any]:
    return {
        "cpus": psutil.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }


class _RawWatch(watch.Watch):  # type: ignore[misc]
    # Plain dicts: deserializing every event into models would make this measuring client
    # compete with the operator for the same two cores.
    def get_return_type(self, func: Any) -> None:
        return None


class ChildWatch:
    """Watches pods and Services labelled with `peer.job_label` in `ns` and records, per job, when
    each child was first seen. The API server closes watches under load (and a watch ends at its
    timeout): each one resumes from the last resourceVersion it saw, or relists after 410 Gone,
    so no ADDED event is lost. Other errors (a 429 while its storage initializes, a dropped
    connection) are retried with backoff; after MAX_FAILURES in a row `wait` fails naming the
    error instead of timing out on a silently dead watch."""

    MAX_FAILURES = 20

    def __init__(self, api: Any, ns: str, label: str) -> None:
        self.core, self.ns, self.label = client.CoreV1Api(api), ns, label
        self.seen: dict[str, dict[str, float]] = {}  # job -> "Kind/name/uid" -> first seen (perf_counter)
        self.resumes = 0
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.listed = {kind: threading.Event() for kind in ("Pod", "Service")}
        self.threads = [
            threading.Thread(target=self._watch, args=(fn, kind), daemon=True)
            for fn, kind in ((self.core.list_namespaced_pod, "Pod"), (self.core.list_namespaced_service, "Service"))
        ]

    def __enter__(self) -> ChildWatch:
        for t in self.threads:
            t.start()
        wait_for(lambda: self._check() or all(e.is_set() for e in self.listed.values()), 60, "the child watches")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()

    def _check(self) -> bool:
        if self.error is not None:
            raise RuntimeError(f"a child watch failed {self.MAX_FAILURES} times in a row") from self.error
        return False

    def children(self, job: str) -> dict[str, float]:
        with self.lock:
            return dict(self.seen.get(job, {}))

    def wait(self, jobs: list[str], count: Callable[[str], int], timeout: float) -> None:
        def complete() -> bool:
            with self.lock:
                return self._check() or all(len(self.seen.get(job, ())) >= count(job) for job in jobs)

        wait_for(complete, timeout, f"{count(jobs[0])} children of each of {len(jobs)} jobs", interval=0.05)

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        job = (meta.get("labels") or {}).get(self.label)
        if job is not None:
            with self.lock:
                # The uid tells a recreated pod (a gang restart reuses the names) from its predecessor.
                key = f"{kind}/{meta['name']}/{meta['uid']}"
                self.seen.setdefault(job, {}).setdefault(key, time.perf_counter())

    def _list(self, list_fn: Any, kind: str) -> str:
        listed = json.loads(list_fn(self.ns, label_selector=self.label, _preload_content=False).data)
        for item in listed["items"]:
            self._record(kind, item)
        self.listed[kind].set()
        return str(listed["metadata"]["resourceVersion"])

    def _stream(self, list_fn: Any, kind: str, version: str) -> str | None:
        """Events from `version` on until the watch ends; the version to resume from, None to relist."""
        w = _RawWatch()
        for event in w.stream(
            list_fn, self.ns, label_selector=self.label, resource_version=version, timeout_seconds=30
        ):
            obj = event["raw_object"]
            if event["type"] == "ERROR":  # a Status, not an object: 410 Gone means relist
                if obj.get("code") == 410:
                    return None
                raise RuntimeError(f"watch error: {obj}")
            version = obj["metadata"]["resourceVersion"]
            if event["type"] == "ADDED":
                self._record(kind, obj)
            if self.stopping.is_set():
                w.stop()
        return version

    def _watch(self, list_fn: Any, kind: str) -> None:
        version: str | None = None
        failures = 0
        while not self.stopping.is_set():
            try:
                if version is None:
                    version = self._list(list_fn, kind)
                else:
                    version = self._stream(list_fn, kind, version)
                    self.resumes += 1  # the watch ended: the next one resumes (or relists)
                failures = 0
            except client.ApiException as exc:
                if exc.status == 410:
                    version = None
                    continue
                failures = self._failed(exc, failures)
            except Exception as exc:
                failures = self._failed(exc, failures)

    def _failed(self, exc: BaseException, failures: int) -> int:
        if self.stopping.is_set():  # the control plane stopping under an open watch
            return failures
        if failures + 1 >= self.MAX_FAILURES:
            self.error = exc
            self.stopping.set()
        self.stopping.wait(min(0.1 * 2**failures, 2.0))
        return failures + 1


def create_jobs(api: Any, peer: Peer, ns: str, names: list[str], nodes: int, threads: int = 8) -> dict[str, float]:
    """Create the jobs at once from `threads` threads; returns when each create returned."""
    from concurrent.futures import ThreadPoolExecutor

    custom = client.CustomObjectsApi(api)
    created_at: dict[str, float] = {}

    def create(name: str) -> None:
        (group, version, plural), body = peer.job(name, nodes)
        custom.create_namespaced_custom_object(group, version, ns, plural, body, _preload_content=False)
        created_at[name] = time.perf_counter()

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(create, names))
    return created_at
