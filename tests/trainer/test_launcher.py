"""The trainer tests' launcher leaves nothing running: torchrun's workers live in sessions of their
own, so killing torchrun's process group alone (what it did before) left them alive."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent(
    f"""
    import subprocess, sys, time
    worker = subprocess.Popen(
        [{sys.executable!r}, '-c', 'import time; time.sleep(120)'], start_new_session=True
    )
    print(worker.pid, flush=True)
    time.sleep(120)
    """
)


def test_cleanup_stops_workers_in_sessions_of_their_own(launcher: Any) -> None:
    # `launcher` is conftest's Launcher fixture (not imported by name: another conftest may own that name).
    gang = launcher.ranks(1, ["-c", SCRIPT])
    (proc,) = gang.procs
    assert proc.stdout is not None
    worker = psutil.Process(int(proc.stdout.readline()))
    launcher.cleanup()
    # A SIGKILLed orphan may take a moment to be reaped; a live one stays: 10 s tells them apart.
    _, alive = psutil.wait_procs([worker], timeout=10)
    for survivor in alive:
        os.kill(survivor.pid, signal.SIGKILL)
    assert not alive, "a worker outlived the launcher's cleanup"
