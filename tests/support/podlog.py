"""Every pod the operator creates in a namespace, recorded from a watch while a test runs: the
evidence for "no duplicate pods" (each attempt of a job got exactly one pod per node) and the
"pods per attempt" figure of the fault tests.

    with PodCreations(api, namespace) as created:
        ...
    assert created.per_attempt("job") == {0: 3, 1: 3}

The watch survives an API server restart: it lists again and watches from there (a pod seen
twice is counted once, by uid)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import TracebackType
from typing import Any

from kubernetes import client, watch

from kubetrain.api import naming


class PodCreations:
    def __init__(self, api: Any, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.pods: dict[str, tuple[str, int, str]] = {}  # uid -> (job, attempt, name)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pod-creations-{namespace}", daemon=True)
        self._lock = threading.Condition()

    def __enter__(self) -> PodCreations:
        self._listed = threading.Event()
        self._thread.start()
        if not self._listed.wait(30):
            raise TimeoutError(f"could not list the pods of {self.namespace}")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(10)

    def _record(self, pod: Any) -> None:
        labels = pod.metadata.labels or {}
        if naming.LABEL_JOB in labels:
            with self._lock:
                attempt = int(labels.get(naming.LABEL_ATTEMPT, "0"))
                self.pods.setdefault(pod.metadata.uid, (labels[naming.LABEL_JOB], attempt, pod.metadata.name))
                self._lock.notify_all()

    def _run(self) -> None:
        selector = naming.LABEL_JOB
        while not self._stop.is_set():
            try:
                listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector, _request_timeout=10)
                for pod in listed.items:
                    self._record(pod)
                self._listed.set()
                stream = watch.Watch().stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    label_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=5,
                    _request_timeout=15,
                )
                for event in stream:
                    if event["type"] == "ADDED":
                        self._record(event["object"])
                    if self._stop.is_set():
                        return
            except Exception:  # an API server restarting, a 410: list again
                time.sleep(0.2)

    def wait(self, count: int, timeout: float = 30) -> int:
        """Block until `count` pods were seen (as soon as their watch events arrive); how many."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.pods) >= count, timeout):
                raise TimeoutError(f"{len(self.pods)} of {count} pods created in {self.namespace}")
            return len(self.pods)

    def per_attempt(self, job: str) -> dict[int, int]:
        """How many pods were created for each attempt of `job`."""
        with self._lock:
            return dict(sorted(Counter(attempt for j, attempt, _ in self.pods.values() if j == job).items()))
