"""Process-tree supervision: start a command as a container's first process would run, stop it
as a kubelet stops a container, and leave nothing of it behind.

A tree starts in a session (and process group) of its own. Its descendants may not stay in
that group: torchrun starts every worker in a session of its own. So the groups of a tree's
descendants are noted while it runs (`note_groups`, a scan of /proc; call it periodically:
once torchrun is gone, its workers are no longer its descendants). `stop` sends SIGTERM to
each tree's group, SIGKILL to it and to every noted group after the grace period, waits for
every tree and reaps the orphans re-parented to this process. Run inside `subreaper()` so
that workers orphaned by a killed torchrun are re-parented here instead of to init: then
they are found, killed and reaped here instead of lingering.

Used by the local runner, the test suite's process node and the trainer tests' launcher.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.02


@dataclass
class ProcessTree:
    """A process started in a session of its own, with the process groups seen below it."""

    proc: subprocess.Popen[Any]
    groups: set[int] = field(default_factory=set)

    @classmethod
    def start(cls, argv: Sequence[str], **popen: Any) -> ProcessTree:
        """`subprocess.Popen(argv, **popen)` in a new session (raises OSError as Popen does)."""
        return cls(subprocess.Popen(list(argv), start_new_session=True, **popen))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None


_subreaper_users = 0
_subreaper_lock = threading.Lock()


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """Make this process the reaper of its orphaned descendants while the block runs. Blocks may
    nest or overlap (kubetrain.client supervises several local jobs in threads): it stays on until
    the last one ends."""
    global _subreaper_users
    with _subreaper_lock:
        _subreaper_users += 1
        if _subreaper_users == 1:
            _set_subreaper(True)
    try:
        yield
    finally:
        with _subreaper_lock:
            _subreaper_users -= 1
            if _subreaper_users == 0:
                _set_subreaper(False)


def _set_subreaper(on: bool) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def note_groups(trees: Sequence[ProcessTree]) -> None:
    """Add the process groups of each live tree's descendants to `tree.groups`."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    for tree in trees:
        todo = list(children.get(tree.pid, []))
        while todo:
            pid = todo.pop()
            tree.groups.add(table[pid][1])
            todo.extend(children.get(pid, []))


def stop(
    trees: Sequence[ProcessTree],
    grace_s: float,
    *,
    wait: Callable[[], None] = lambda: time.sleep(POLL_S),
    hurry: Callable[[], bool] = lambda: False,
) -> int:
    """SIGTERM every tree's group, SIGKILL what is left after `grace_s` (at once when `hurry()`
    turns true), wait for every tree and reap its orphans. `wait` is called while waiting (the
    local runner pumps output there). Returns how many trees were still running."""
    note_groups(trees)
    live = [tree for tree in trees if tree.running()]
    for tree in live:
        _killpg(tree.pid, signal.SIGKILL if hurry() else signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(tree.running() for tree in live) and time.monotonic() < deadline and not hurry():
        wait()
    note_groups(trees)
    mine = _own_groups()
    for tree in trees:
        # Stragglers of the tree's group, even if its first process is gone, and the workers'
        # own groups (only those still holding a process of ours: a group id can be reused).
        _killpg(tree.pid, signal.SIGKILL)
        for group in tree.groups & mine:
            _killpg(group, signal.SIGKILL)
    for tree in trees:
        tree.proc.wait()
        for group in {tree.pid, *tree.groups}:
            _reap_group(group)
    return len(live)


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process, from /proc (empty without one: there
    only each tree's own group is stopped)."""
    found: dict[int, tuple[int, int]] = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # After the command name (which may contain spaces and parentheses): state, ppid, pgrp.
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return found


def _own_groups() -> set[int]:
    """Process groups holding a live descendant of this process (orphans re-parented here included)."""
    table = _processes()
    me = os.getpid()
    groups = set()
    for pid, (_, pgrp) in table.items():
        ancestor, seen = pid, 0
        while ancestor in table and seen < len(table):
            ancestor = table[ancestor][0]
            seen += 1
            if ancestor == me:
                groups.add(pgrp)
                break
    return groups


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _reap_group(pgid: int, timeout_s: float = 5.0) -> None:
    """Wait for the orphans of a group that were re-parented to this subreaper."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(POLL_S)
