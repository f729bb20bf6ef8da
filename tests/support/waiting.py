"""The one way tests wait: poll a condition until it holds, with a deadline that names what was
awaited. Tests wait on conditions, never on fixed sleeps."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    interval: float = 0.1,
    proc: subprocess.Popen[str] | None = None,
) -> T:
    """Poll `condition()` until it returns something truthy and return that. At the deadline, or
    when `proc` (a process the condition depends on) exits first, raise AssertionError naming
    `what` (and the process' exit code and output tail)."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"waiting for {what}: the process exited with {proc.returncode}\n{out[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def http_ok(url: str) -> bool:
    """Whether `url` answers 200 right now (a refused or failed connection is just "not yet")."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False
