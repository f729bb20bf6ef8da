"""The one process-tree supervision module: workers in sessions of their own are stopped too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from kubetrain.local.processes import ProcessTree, note_groups, stop, subreaper

pytestmark = pytest.mark.unit

# A worker as torchrun starts one: in a session of its own; this one also ignores SIGTERM, so only
# a SIGKILL of its own group ends it.
WORKER = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
)
LAUNCHER = textwrap.dedent(
    f"""
    import subprocess, sys, time
    worker = subprocess.Popen([{sys.executable!r}, '-c', {WORKER!r}], start_new_session=True, stdout=subprocess.PIPE)
    worker.stdout.readline()
    print(worker.pid, flush=True)
    {{tail}}
    """
)


def start(tail: str) -> tuple[ProcessTree, int]:
    """A launcher whose worker ignores SIGTERM in a session of its own; returns it and the worker's pid."""
    tree = ProcessTree.start([sys.executable, "-c", LAUNCHER.format(tail=tail)], stdout=subprocess.PIPE, text=True)
    assert tree.proc.stdout is not None
    return tree, int(tree.proc.stdout.readline())


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_left(pids: list[int]) -> list[int]:
    """The pids still alive, killed here so that a failing test leaks nothing."""
    left = [pid for pid in pids if not gone(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def test_stop_reaches_a_worker_in_a_session_of_its_own() -> None:
    tree, worker = start("time.sleep(120)")
    assert os.getsid(worker) != os.getsid(tree.pid)
    with subreaper():
        assert stop([tree], grace_s=0.5) == 1
    assert not kill_left([worker]), "the worker outlived stop()"
    assert tree.proc.returncode == -signal.SIGTERM


def test_a_worker_orphaned_by_its_launcher_is_found_by_its_noted_group() -> None:
    # The launcher dies first (as a SIGKILLed torchrun): the worker is re-parented to this
    # subreaper and only its group, noted while the launcher lived, leads to it.
    with subreaper():
        tree, worker = start("time.sleep(120)")
        note_groups([tree])
        assert os.getpgid(worker) in tree.groups
        os.kill(tree.pid, signal.SIGKILL)
        tree.proc.wait()
        assert psutil.Process(worker).ppid() == os.getpid()
        assert stop([tree], grace_s=0) == 0
    assert not kill_left([worker]), "the orphaned worker outlived stop()"


@pytest.mark.parametrize("grace_s", [0.0, 30.0])
def test_a_finished_tree_is_only_reaped(grace_s: float) -> None:
    tree = ProcessTree.start([sys.executable, "-c", "pass"])
    tree.proc.wait()
    started = time.monotonic()
    assert stop([tree], grace_s=grace_s) == 0
    assert time.monotonic() - started < 10
