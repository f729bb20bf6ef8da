"""A TCP server on 127.0.0.1 that accepts every connection and never answers: the store, proxy or
load balancer that hangs instead of refusing. Its connections are held until it closes."""

from __future__ import annotations

import socket
import threading
from types import TracebackType


class SilentServer:
    """`with SilentServer() as server:` listens at `server.endpoint` (http://127.0.0.1:port) until
    the block ends; `accepted` counts the connections it took and never answered."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self._socket.settimeout(0.2)
        self.port = self._socket.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._held.append(conn)

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self._socket.close()
