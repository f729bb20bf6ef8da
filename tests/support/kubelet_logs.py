"""The log half of a kubelet, so `pods/log` works on the test control plane.

The API server answers `GET pods/<pod>/log` by calling the kubelet of the pod's node at
`https://<node address>:<daemonEndpoints.kubeletEndpoint.Port>/containerLogs/<ns>/<pod>/<container>`
(without checking the kubelet's certificate unless --kubelet-certificate-authority is set).
`KubeletLogs` serves that path over TLS on 127.0.0.1 and registers itself as the kubelet
endpoint of its FakeKubelet's Node; the pods that FakeKubelet binds then have the logs the test
writes:

    kubelet = FakeKubelet(api, node_name="kubetrain-log-node")   # a node of its own
    with KubeletLogs(kubelet, tmp_path) as logs:
        kubelet.run(ns, "job-node-0")
        logs.write("job-node-0", '{"event": "step", ...}')

With `source` (a process node's `logs(namespace, pod, container)`) it serves what the pods'
processes really wrote instead.
"""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

LogSource = Callable[[str, str, str], str]  # (namespace, pod, container) -> the whole log


class Node(Protocol):
    """What this needs of a test node: its Node object's name, and an API client for it."""

    core: Any
    node_name: str

    def ensure_node(self) -> None: ...


class KubeletLogs:
    def __init__(self, kubelet: Node, workdir: Path, source: LogSource | None = None) -> None:
        self.kubelet = kubelet
        self.workdir = workdir
        self.source = source
        self.lines: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.server: http.server.ThreadingHTTPServer | None = None

    def write(self, pod: str, line: str) -> None:
        """Append a line to the log of the trainer container of `pod` (any namespace)."""
        with self.lock:
            self.lines.setdefault(pod, []).append(line)

    def clear(self, pod: str) -> None:
        """A new pod of the same name starts with an empty log."""
        with self.lock:
            self.lines.pop(pod, None)

    def tail(self, pod: str, lines: int | None, namespace: str = "", container: str = "") -> str:
        if self.source is not None:
            text = self.source(namespace, pod, container).splitlines()
            return "".join(f"{line}\n" for line in (text[-lines:] if lines else text))
        with self.lock:
            kept = self.lines.get(pod, [])
            kept = kept[-lines:] if lines else kept
            return "".join(f"{line}\n" for line in kept)

    def __enter__(self) -> KubeletLogs:
        cert, key = self.workdir / "kubelet.crt", self.workdir / "kubelet.key"
        subject = ["-subj", "/CN=127.0.0.1", "-days", "1"]
        ec_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key)]
        subprocess.run(
            ["openssl", "req", "-x509", *ec_key, "-out", str(cert), *subject], check=True, capture_output=True
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, name="kubelet-logs", daemon=True).start()
        self.kubelet.ensure_node()
        endpoint = {"kubeletEndpoint": {"Port": self.server.server_address[1]}}
        addresses = [{"type": "InternalIP", "address": "127.0.0.1"}]
        self.kubelet.core.patch_node_status(
            self.kubelet.node_name, {"status": {"addresses": addresses, "daemonEndpoints": endpoint}}
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _handler(logs: KubeletLogs) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404)
                return
            tail = parse_qs(url.query).get("tailLines", [""])[0]
            body = logs.tail(parts[2], int(tail) if tail.isdigit() else None, parts[1], parts[3]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the operator reads every progress interval."""

    return Handler
