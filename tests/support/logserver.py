"""The log half of a kubelet, so `pods/log` works on the test control plane.

The API server answers `GET pods/<pod>/log` by calling the kubelet of the pod's node at
`https://<node address>:<daemonEndpoints.kubeletEndpoint.Port>/containerLogs/<ns>/<pod>/<container>`
(without checking the kubelet's certificate unless --kubelet-certificate-authority is set),
passing `tailLines` and `follow` on. `LogServer` serves that path over TLS on 127.0.0.1 from a
`Source` and registers itself as the kubelet endpoint of a Node: support.kubelet_logs (lines a
test writes, for FakeKubelet) and support.processnode (the files its processes write) use it.
"""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlparse

# (namespace, pod, container, tailLines or None, follow) -> the log's bytes, in pieces; a
# follow source ends when the container has exited. LookupError: no such container (404).
Source = Callable[[str, str, str, int | None, bool], Iterable[bytes]]


class LogServer:
    def __init__(self, source: Source, workdir: Path) -> None:
        self.source = source
        self.workdir = workdir
        self.server: http.server.ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def __enter__(self) -> LogServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cert, key = self.workdir / "kubelet.crt", self.workdir / "kubelet.key"
        subject = ["-subj", "/CN=127.0.0.1", "-days", "1"]
        ec_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key)]
        subprocess.run(
            ["openssl", "req", "-x509", *ec_key, "-out", str(cert), *subject], check=True, capture_output=True
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.source))
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, name="kubelet-logs", daemon=True).start()
        return self

    def register(self, core: Any, node_name: str) -> None:
        """Make this server the kubelet endpoint of Node `node_name` (which must exist)."""
        endpoint = {"kubeletEndpoint": {"Port": self.port}}
        addresses = [{"type": "InternalIP", "address": "127.0.0.1"}]
        core.patch_node_status(node_name, {"status": {"addresses": addresses, "daemonEndpoints": endpoint}})

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _handler(source: Source) -> type[http.server.BaseHTTPRequestHandler]:
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
            try:
                pieces = iter(source(parts[1], parts[2], parts[3], int(tail) if tail.isdigit() else None, follow))
                first = next(pieces, b"")
            except LookupError as missing:
                self.send_error(404, str(missing))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()  # HTTP/1.0: the body ends when the connection closes
            self.wfile.write(first)
            self.wfile.flush()
            for piece in pieces:
                self.wfile.write(piece)
                self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the operator reads every progress interval."""

    return Handler
