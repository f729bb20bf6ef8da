"""No process of the tests outlives them: a pytest plugin (registered by tests/conftest.py).

The session that starts first (the one pytest-xdist's workers are spawned from, or the only one)
puts a marker in its environment before any test runs; every process the tests start inherits
it, torchrun's workers, a forked worker whose agent was killed and containerd's shims included,
unless a test hands a process an environment of its own (a pod's container does: the real
node's pods end with the node). When the session ends, every other process still carrying the
marker gets GRACE_S to go; those left are listed, killed (they are the tests' own: the marker is
unique to this session) and the session fails.

Seen before this existed: a worker of a killed local node, still blocked 66 minutes after the
suite started, orphaned to init and holding 500 MB.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

MARKER_ENV = "KUBETRAIN_TEST_SESSION"
GRACE_ENV = "KUBETRAIN_TEST_LEFTOVER_GRACE_S"  # this plugin's own test sets it shorter
GRACE_S = float(os.environ.get(GRACE_ENV, "30"))
POLL_S = 0.5

_owned: str | None = None  # the marker, in the session that set it


def pytest_configure(config: pytest.Config) -> None:
    global _owned
    if MARKER_ENV not in os.environ:  # not in xdist's workers, nor in a pytest a test starts
        _owned = os.environ[MARKER_ENV] = uuid.uuid4().hex


def carriers(marker: str) -> dict[int, str]:
    """pid -> command line of every other live process whose environment holds the marker."""
    wanted = f"{MARKER_ENV}={marker}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found[int(entry.name)] = command.strip()[:300]
    return found


def leftovers(marker: str, grace_s: float = GRACE_S) -> dict[int, str]:
    """The carriers still there after `grace_s` (processes that are ending get that long)."""
    deadline = time.monotonic() + grace_s
    while (found := carriers(marker)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return found


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _owned is None or os.environ.get(MARKER_ENV) != _owned:
        return
    left = leftovers(_owned)
    if not left:
        return
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    lines = "\n".join(f"  pid {pid}: {command}" for pid, command in sorted(left.items()))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"{len(left)} process(es) the tests started outlived them by {GRACE_S:.0f} s (now killed):\n{lines}"
    if reporter is not None:
        reporter.write_sep("=", "processes left behind", red=True)
        reporter.write_line(message)
    else:
        print(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
