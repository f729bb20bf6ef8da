"""Supervision of a local gang: start the node processes, merge their output, apply the gang
decision (`gang.decide`), restart or stop, and leave no process behind (`kubetrain.local.processes`)."""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any, Protocol

from kubetrain.api.contract import free_port
from kubetrain.api.records import parse_record
from kubetrain.local import gang
from kubetrain.local.plan import LocalPlan, NodeProcess
from kubetrain.local.processes import ProcessTree, note_groups, stop, subreaper
from kubetrain.local.result import RunResult

# How often the process groups under each node are noted (a scan of /proc).
NOTE_GROUPS_EVERY_S = 1.0


class RunView(Protocol):
    """Where a local run reports: a live terminal view or plain lines."""

    def attempt(self, attempt: int, nodes: Sequence[NodeProcess], pids: Sequence[int]) -> None: ...
    def output(self, rank: int, stream: str, text: str) -> None: ...
    def record(self, record: dict[str, Any]) -> None: ...
    def notice(self, text: str) -> None: ...


@dataclass
class _Node:
    spec: NodeProcess
    tree: ProcessTree
    readers: list[threading.Thread]


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
            tree = ProcessTree.start(
                argv,
                env=spec.full_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as error:
            raise gang_start_error(spec, error) from None
        proc = tree.proc
        assert proc.stdout is not None and proc.stderr is not None
        readers = [
            threading.Thread(target=self._read, args=(spec.rank, name, pipe), daemon=True)
            for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr))
        ]
        for reader in readers:
            reader.start()
        return _Node(spec, tree, readers)

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
        started = time.monotonic()
        live = stop(
            [node.tree for node in nodes], self.grace_s, wait=lambda: self._pump(0.05), hurry=lambda: self._hurry
        )
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
        try:
            with subreaper(), self._signals(), contextlib.ExitStack() as logs:
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
                json.dumps({"attempt": attempt, "pids": [node.tree.proc.pid for node in nodes]}) + "\n"
            )
            self.view.attempt(attempt, specs, [node.tree.proc.pid for node in nodes])
            noted = 0.0
            while True:
                self._pump(0.1)
                if time.monotonic() - noted >= NOTE_GROUPS_EVERY_S:
                    # Before a torchrun dies: afterwards its workers are no longer its descendants.
                    note_groups([node.tree for node in nodes])
                    noted = time.monotonic()
                if self._signal is not None:
                    self.view.notice(f"{signal.Signals(self._signal).name}: stopping all nodes")
                    self._stop(nodes)
                    return None
                decision = gang.decide(
                    [node.tree.proc.poll() for node in nodes],
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
            self.result.node_exit_codes = [node.tree.proc.returncode for node in nodes]


class NodeStartError(RuntimeError):
    pass


def gang_start_error(spec: NodeProcess, error: OSError) -> NodeStartError:
    return NodeStartError(f"node {spec.rank}: cannot start {spec.argv[0]!r}: {error.strerror or error}")
