"""The log half of a kubelet, so `pods/log` works on the test control plane.

The API server answers `GET pods/<pod>/log` by calling the kubelet of the pod's node at
`https://<node address>:<daemonEndpoints.kubeletEndpoint.Port>/containerLogs/<ns>/<pod>/<container>`
(without checking the kubelet's certificate unless --kubelet-certificate-authority is set).
`LogServer` serves that path over TLS on 127.0.0.1 and registers itself as the kubelet endpoint
of a Node, reading the logs from a `read` function; `?follow=true` streams what it yields
until it ends. Two users:

- `KubeletLogs`, for a FakeKubelet's node: the pods it binds have the lines the test writes;
- the process node (support.processnode), which serves its processes' real output.

    kubelet = FakeKubelet(api, node_name="kubetrain-log-node")   # a node of its own
    with KubeletLogs(kubelet, tmp_path) as logs:
        kubelet.run(ns, "job-node-0")
        logs.write("job-node-0", '{"event": "step", ...}')
"""

from __future__ import annotations

import http.server
import itertools
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlparse

from support.kubelet import FakeKubelet

# (namespace, pod, container, tailLines or None, follow) -> the log's bytes, in chunks;
# LookupError: there is no such log (a 404); ContainerRemoved: the kubelet's 200 saying so.
LogReader = Callable[[str, str, str, int | None, bool], Iterable[bytes]]


class ContainerRemoved(LookupError):
    """The container, and its log, are gone (a deleted pod's, once stopped). A kubelet has sent
    the headers by the time it finds out, so it answers 200 with one line (kubelet_pods.go)."""

    def __init__(self, container_id: str) -> None:
        super().__init__(f"unable to retrieve container logs for {container_id}")


class LogServer:
    def __init__(self, core: Any, node_name: str, workdir: Path, read: LogReader) -> None:
        self.core, self.node_name, self.workdir, self.read = core, node_name, workdir, read
        self.server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> None:
        """Serve, and make the Node's only address 127.0.0.1 with this port as its kubelet's (the
        API server tries a Hostname address first, which would not resolve)."""
        cert, key = self.workdir / "kubelet.crt", self.workdir / "kubelet.key"
        subject = ["-subj", "/CN=127.0.0.1", "-days", "1"]
        ec_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key)]
        subprocess.run(
            ["openssl", "req", "-x509", *ec_key, "-out", str(cert), *subject], check=True, capture_output=True
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.read))
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, name="kubelet-logs", daemon=True).start()
        endpoint = {"kubeletEndpoint": {"Port": self.server.server_address[1]}}
        addresses = [{"$patch": "replace"}, {"type": "InternalIP", "address": "127.0.0.1"}]
        self.core.patch_node_status(self.node_name, {"status": {"addresses": addresses, "daemonEndpoints": endpoint}})

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class KubeletLogs:
    def __init__(self, kubelet: FakeKubelet, workdir: Path) -> None:
        self.kubelet = kubelet
        self.lines: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.server = LogServer(kubelet.core, kubelet.node_name, workdir, self._read)

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

    def _read(self, namespace: str, pod: str, container: str, tail: int | None, follow: bool) -> Iterable[bytes]:
        # What was written so far, and the stream closes (as a container's that has exited).
        return [self.tail(pod, tail).encode()]

    def __enter__(self) -> KubeletLogs:
        self.kubelet.ensure_node()
        self.server.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.server.stop()


def _handler(read: LogReader) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404)
                return
            query = parse_qs(url.query)
            tail = query.get("tailLines", [""])[0]
            follow = query.get("follow", [""])[0] == "true"
            try:  # the first chunk before the status line: a missing log is a 404, as a kubelet's
                chunks = iter(read(parts[1], parts[2], parts[3], int(tail) if tail.isdigit() else None, follow))
                first = next(chunks, b"")
            except ContainerRemoved as removed:
                chunks, first = iter(()), str(removed).encode()
            except LookupError as missing:
                self.send_error(404, str(missing))
                return
            chunks = itertools.chain([first], chunks)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            if not follow:
                body = b"".join(chunks)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            # HTTP/1.0 without a length: the body is what comes until the connection closes.
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(chunk)
                self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the operator reads every progress interval."""

    return Handler
