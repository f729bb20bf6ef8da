"""Wait for a TCP endpoint whose DNS name may not exist yet, polling at a short fixed interval.

A headless Service publishes a pod's name once the pod has an IP; in a recreated gang the other
nodes' processes usually start before node 0's name resolves, and it does a second or two later.
torch's own store client retries a failed resolution with growing gaps (seen on the real node:
`gai error: -2` repeated, 4-5 s lost), so both the trainer (runtime/worker/dist.py) and the torchrun
agent (runtime/agent/inplace.py, before its rendezvous store connects) wait here first. Torch-free.
"""

from __future__ import annotations

import socket
import time

# Short and fixed: the name is usually seconds away, and a growing gap only adds to the wait.
INTERVAL_S = 0.1


class Unreachable(OSError):
    """The endpoint did not accept a connection in time; the message holds the last error."""


def wait_for(host: str, port: int, timeout_s: float, *, interval_s: float = INTERVAL_S) -> float:
    """Retry resolving and connecting to host:port every `interval_s` until a connection is
    accepted; return the seconds waited, or raise Unreachable after `timeout_s`."""
    start = time.monotonic()
    last_error = ""
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, max(timeout_s, 0.1))):
                return time.monotonic() - start
        except OSError as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        waited = time.monotonic() - start
        if waited >= timeout_s:
            raise Unreachable(
                f"{host}:{port} did not accept a connection within {waited:.1f} s; last error: {last_error}"
            )
        time.sleep(min(interval_s, max(timeout_s - waited, 0.0)))
