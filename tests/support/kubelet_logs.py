"""Logs a test writes, served as a FakeKubelet's container logs through `pods/log`
(support.logserver): the pods that FakeKubelet binds then have the logs the test writes.

    kubelet = FakeKubelet(api, node_name="kubetrain-log-node")   # a node of its own
    with KubeletLogs(kubelet, tmp_path) as logs:
        kubelet.run(ns, "job-node-0")
        logs.write("job-node-0", '{"event": "step", ...}')
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from support.kubelet import FakeKubelet
from support.logserver import LogServer


class KubeletLogs:
    def __init__(self, kubelet: FakeKubelet, workdir: Path) -> None:
        self.kubelet = kubelet
        self.workdir = workdir
        self.lines: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.server = LogServer(self._serve, workdir)

    def write(self, pod: str, line: str) -> None:
        """Append a line to the log of the trainer container of `pod` (any namespace)."""
        with self.lock:
            self.lines.setdefault(pod, []).append(line)

    def clear(self, pod: str) -> None:
        """A new pod of the same name starts with an empty log."""
        with self.lock:
            self.lines.pop(pod, None)

    def tail(self, pod: str, lines: int | None) -> str:
        with self.lock:
            kept = self.lines.get(pod, [])
            kept = kept[-lines:] if lines else kept
            return "".join(f"{line}\n" for line in kept)

    def _serve(self, namespace: str, pod: str, container: str, tail: int | None, follow: bool) -> Iterable[bytes]:
        # What was written so far, then the stream closes (follow or not).
        return [self.tail(pod, tail).encode()]

    def __enter__(self) -> KubeletLogs:
        self.server.__enter__()
        self.kubelet.ensure_node()
        self.server.register(self.kubelet.core, self.kubelet.node_name)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.server.__exit__(kind, error, traceback)
