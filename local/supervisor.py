"""Supervision of a local gang: start the node processes, merge their output, apply the gang
decision (`gang.decide`), restart or stop, and leave no process behind.

Each node runs in its own session and process group. torchrun starts every worker in a
session of its own, so a node's processes span several groups: the supervisor notes the groups
of each node's descendants while it runs. Stopping sends SIGTERM to the node's group (as a
kubelet signals a container's first process), SIGKILL to every noted group after a grace
period, then waits for every process. This process becomes a child subreaper while it runs,
so workers orphaned by a killed torchrun are re-parented, killed and reaped here instead of
lingering.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Literal, Protocol

from kubetrain.api.contract import free_port
from kubetrain.api.records import parse_record
from kubetrain.local import gang
from kubetrain.local.plan import LocalPlan, NodeProcess

PR_SET_CHILD_SUBREAPER = 36
# How often the process groups under each node are noted (a scan of /proc).
NOTE_GROUPS_EVERY_S = 1.0
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_SIGNAL_BASE = 128

Outcome = Literal["Succeeded", "Failed", "Interrupted"]


class RunView(Protocol):
    """Where a local run reports: a live terminal view or plain lines."""

    def attempt(self, attempt: int, nodes: Sequence[NodeProcess], pids: Sequence[int]) -> None: ...
    def output(self, rank: int, stream: str, text: str) -> None: ...
    def record(self, record: dict[str, Any]) -> None: ...
    def notice(self, text: str) -> None: ...


@dataclass
class RunResult:
    outcome: Outcome
    reason: str
    run_dir: Path
    attempts: int = 0
    restarts: int = 0
    wall_s: float = 0.0
    first_step_s: float | None = None
    final_loss: float | None = None
    final_accuracy: float | None = None
    final_step: int | None = None
    checkpoints_written: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    # Exit codes of the last attempt's node processes, by node rank.
    node_exit_codes: list[int | None] = field(default_factory=list)
    signal: int | None = None
    plot: str | None = None

    @property
    def exit_code(self) -> int:
        if self.outcome == "Succeeded":
            return EXIT_OK
        if self.signal is not None:
            return EXIT_SIGNAL_BASE + self.signal
        return EXIT_FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "reason": self.reason,
            "exitCode": self.exit_code,
            "runDir": str(self.run_dir),
            "attempts": self.attempts,
            "restarts": self.restarts,
            "wallSeconds": round(self.wall_s, 3),
            "firstStepSeconds": None if self.first_step_s is None else round(self.first_step_s, 3),
            "finalStep": self.final_step,
            "finalLoss": self.final_loss,
            "finalAccuracy": self.final_accuracy,
            "checkpointsWritten": self.checkpoints_written,
            "failures": self.failures,
            "nodeExitCodes": self.node_exit_codes,
            "plot": self.plot,
        }


def _set_subreaper(on: bool) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


@dataclass
class _Node:
    spec: NodeProcess
    proc: subprocess.Popen[bytes]
    readers: list[threading.Thread]
    # Process groups seen among this node's descendants (torchrun's workers, their children).
    groups: set[int] = field(default_factory=set)


class Supervisor:
    def __init__(self, plan: LocalPlan, view: RunView, *, grace_s: float = 10.0, first_attempt: int = 0) -> None:
        self.plan = plan
        self.view = view
        self.grace_s = grace_s
        self.first_attempt = first_attempt
        self._lines: queue.Queue[tuple[int, str, str]] = queue.Queue()
        self._logs: dict[int, IO[str]] = {}
        self._signal: int | None = None
        self._hurry = False
        self.result = RunResult("Failed", "", plan.run_dir)
        self._start = 0.0

    # --- signals -------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._signal is not None:
            self._hurry = True  # a second Ctrl-C: no more grace
        self._signal = signum

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # --- processes -----------------------------------------------------------------------

    def _read(self, rank: int, stream: str, pipe: IO[bytes]) -> None:
        with pipe:
            for raw in pipe:
                self._lines.put((rank, stream, raw.decode("utf-8", "replace").rstrip("\r\n")))

    def _launch(self, spec: NodeProcess) -> _Node:
        argv = spec.argv if spec.netns is None else ["ip", "netns", "exec", spec.netns, *spec.argv]
        try:
            proc = subprocess.Popen(
                argv,
                env=spec.full_env(),
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as error:
            raise gang_start_error(spec, error) from None
        assert proc.stdout is not None and proc.stderr is not None
        readers = [
            threading.Thread(target=self._read, args=(spec.rank, name, pipe), daemon=True)
            for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr))
        ]
        for reader in readers:
            reader.start()
        return _Node(spec, proc, readers)

    def _pump(self, timeout: float) -> None:
        """Handle output lines until the queue is empty (waiting up to `timeout` for the first)."""
        try:
            item = self._lines.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._handle_line(*item)
            try:
                item = self._lines.get_nowait()
            except queue.Empty:
                return

    def _handle_line(self, rank: int, stream: str, text: str) -> None:
        log = self._logs.get(rank)
        if log is not None:
            log.write(text + "\n")
            log.flush()
        record = parse_record(text) if rank == 0 and stream == "stdout" else None
        if record is None:
            self.view.output(rank, stream, text)
            return
        self._observe(record)
        self.view.record(record)

    def _observe(self, record: dict[str, Any]) -> None:
        result = self.result
        event = record["event"]
        if event == "step" and result.first_step_s is None:
            result.first_step_s = time.monotonic() - self._start
        if event in ("step", "done") and record.get("loss") is not None:
            result.final_loss = float(record["loss"])
        if event in ("eval", "done") and record.get("accuracy") is not None:
            result.final_accuracy = float(record["accuracy"])
        if record.get("step") is not None:
            result.final_step = int(record["step"])
        if event == "checkpoint" and record.get("path"):
            result.checkpoints_written.append(str(record["path"]))

    def _stop(self, nodes: Sequence[_Node]) -> None:
        """SIGTERM every node's process group, SIGKILL what is left after the grace period,
        wait for every process (and reap orphaned workers)."""
        started = time.monotonic()
        _note_groups(nodes)
        live = sum(node.proc.poll() is None for node in nodes)
        for node in nodes:
            if node.proc.poll() is None:
                _killpg(node.proc.pid, signal.SIGKILL if self._hurry else signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while any(node.proc.poll() is None for node in nodes) and time.monotonic() < deadline and not self._hurry:
            self._pump(0.05)
        _note_groups(nodes)
        mine = _own_groups()
        for node in nodes:
            # Stragglers of the node's group, even if torchrun is gone, and the workers' own groups
            # (only those still holding a process of ours: a group id could have been reused).
            _killpg(node.proc.pid, signal.SIGKILL)
            for group in node.groups & mine:
                _killpg(group, signal.SIGKILL)
        for node in nodes:
            node.proc.wait()
            for group in {node.proc.pid, *node.groups}:
                _reap_group(group)
        if live:
            self.view.notice(f"stopped {live} running node(s) in {time.monotonic() - started:.1f}s")

    def _finish_attempt(self, nodes: Sequence[_Node]) -> None:
        for node in nodes:
            for reader in node.readers:
                reader.join(timeout=5)
        self._pump(0)

    # --- the gang loop -------------------------------------------------------------------

    def run(self) -> RunResult:
        plan = self.plan
        policy = plan.job.spec.run_policy
        result = self.result
        self._start = time.monotonic()
        attempt = self.first_attempt
        _set_subreaper(True)
        try:
            with self._signals(), contextlib.ExitStack() as logs:
                for rank in range(plan.job.spec.nodes):
                    self._logs[rank] = logs.enter_context(open(plan.run_dir / f"node-{rank}.log", "a"))
                while True:
                    decision = self._attempt(attempt, policy.max_restarts, policy.active_deadline_seconds)
                    result.attempts += 1
                    if decision is None:
                        assert self._signal is not None
                        result.outcome, result.signal = "Interrupted", self._signal
                        result.reason = signal.Signals(self._signal).name
                        break
                    if decision.action == "succeed":
                        result.outcome, result.reason = "Succeeded", decision.reason
                        break
                    if decision.failed_rank is not None:
                        result.failures.append(
                            {"attempt": attempt, "rank": decision.failed_rank, "exitCode": decision.exit_code}
                        )
                    if decision.action == "fail":
                        result.outcome, result.reason = "Failed", decision.reason
                        break
                    result.restarts += 1
                    self.view.notice(
                        f"node {decision.failed_rank} exited with {decision.exit_code}: gang restart "
                        f"{result.restarts}/{policy.max_restarts}, resuming from the last checkpoint"
                    )
                    attempt += 1
        finally:
            _set_subreaper(False)
            result.wall_s = time.monotonic() - self._start
        return result

    def _attempt(self, attempt: int, max_restarts: int, deadline_s: int | None) -> gang.Decision | None:
        """Run one gang attempt to its end; None when a signal stopped it."""
        specs = self.plan.nodes(attempt, master_port=free_port())
        nodes: list[_Node] = []
        try:
            for spec in specs:
                self._logs[spec.rank].write(f"=== kubetrain: attempt {attempt} ===\n")
                nodes.append(self._launch(spec))
            (self.plan.run_dir / "pids.json").write_text(
                json.dumps({"attempt": attempt, "pids": [node.proc.pid for node in nodes]}) + "\n"
            )
            self.view.attempt(attempt, specs, [node.proc.pid for node in nodes])
            noted = 0.0
            while True:
                self._pump(0.1)
                if time.monotonic() - noted >= NOTE_GROUPS_EVERY_S:
                    # Before a torchrun dies: afterwards its workers are no longer its descendants.
                    _note_groups(nodes)
                    noted = time.monotonic()
                if self._signal is not None:
                    self.view.notice(f"{signal.Signals(self._signal).name}: stopping all nodes")
                    self._stop(nodes)
                    return None
                decision = gang.decide(
                    [node.proc.poll() for node in nodes],
                    restarts=self.result.restarts,
                    max_restarts=max_restarts,
                    elapsed_s=time.monotonic() - self._start,
                    active_deadline_s=deadline_s,
                )
                if decision.action == "wait":
                    continue
                if decision.reason == gang.REASON_DEADLINE:
                    self.view.notice(f"activeDeadlineSeconds ({deadline_s}) reached: stopping all nodes")
                # Also after success: whatever a node left running in its group goes, as with a
                # finished pod, and its orphans re-parented to this subreaper are reaped.
                self._stop(nodes)
                return decision
        except BaseException:
            self._stop(nodes)
            raise
        finally:
            self._finish_attempt(nodes)
            self.result.node_exit_codes = [node.proc.returncode for node in nodes]


class NodeStartError(RuntimeError):
    pass


def gang_start_error(spec: NodeProcess, error: OSError) -> NodeStartError:
    return NodeStartError(f"node {spec.rank}: cannot start {spec.argv[0]!r}: {error.strerror or error}")


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process, from /proc (empty without one: there
    only each node's own group is stopped)."""
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


def _note_groups(nodes: Sequence[_Node]) -> None:
    """Add the process groups of each live node's descendants to `node.groups`."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    for node in nodes:
        todo = list(children.get(node.proc.pid, []))
        while todo:
            pid = todo.pop()
            node.groups.add(table[pid][1])
            todo.extend(children.get(pid, []))


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
    """Wait for orphans of a node's group that were re-parented to this subreaper."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.02)
