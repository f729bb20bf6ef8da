"""Supervision of a local gang with the operator's own decision.

Each loop turns the node processes into the pod views the operator sees on a cluster
(`kubetrain.operator.pods.PodView`: Running while the process lives, then Succeeded or
Failed with its exit code, `finished` = when the exit was observed, to the second as on a
cluster) and calls the operator's
pure `status.decide`. Its Decision is applied here as the operator applies it to the API:
`status` becomes `<run-dir>/status.json` (the shape of the cluster's `.status`),
`delete_pods` stops those processes (`kubetrain.local.processes`), `create_ranks` starts
them. Rank 0's metrics records are folded into the status with `kubetrain.api.records.fold`,
as the operator folds rank 0's log. So restarts, failures, the node blamed, deadlines and
progress follow one rule on a cluster and here.

Each node's output goes to `<run-dir>/node-<i>.log` (every attempt of every run in this run
dir, each after a `=== kubetrain: attempt N ===` line: what `kubetrain logs -f` shows) and to
`<run-dir>/attempts/<N>/node-<i>.log` (attempt N of this run only: what the operator keeps in a
cluster's log archive and `kubetrain logs --attempt N` shows; docs/logs.md).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any, Protocol

from kubetrain.api.contract import MEMBERS_FILE, format_members, free_port, stacks_after_seconds
from kubetrain.api.models import TrainingJobStatus
from kubetrain.api.records import (
    AGENT_EVENTS,
    REFUSED,
    SKIPPED,
    GangFailure,
    fold,
    fold_refusal,
    fold_skip,
    fold_timeline,
    gang_failure,
    parse_record,
)
from kubetrain.local.plan import ATTEMPTS_SUBDIR, LocalPlan, NodeProcess, attempt_log
from kubetrain.local.processes import ProcessTree, note_groups, stop, subreaper
from kubetrain.local.result import RunResult
from kubetrain.operator import forensics
from kubetrain.operator.conditions import is_true
from kubetrain.operator.decision import DEFAULT_POLICY, Decision, Policy
from kubetrain.operator.forensics import RankStacks
from kubetrain.operator.pods import PodView
from kubetrain.operator.progress import refusal_events
from kubetrain.operator.render import grace_seconds
from kubetrain.operator.status import decide

# How often the process groups under each node are noted (a scan of /proc).
NOTE_GROUPS_EVERY_S = 1.0
POLL_S = 0.1
# Rank 0's progress goes to status.json at most this often (a finished decision at once).
PUBLISH_EVERY_S = 1.0
# How long the output of an exited node is awaited (see _drain).
READ_TAIL_S = 2.0
# The line each node log gets when an attempt starts (the stacks of a stall are read after it).
ATTEMPT_BANNER = "=== kubetrain: attempt "
# A failed process's termination message: the end of its output, as Kubernetes takes it
# for terminationMessagePolicy FallbackToLogsOnError (80 lines or 2048 bytes, the smaller).
MESSAGE_LINES = 80
MESSAGE_BYTES = 2048
STATUS_FILE = "status.json"
SIGNAL_EXIT_BASE = 128


class RunView(Protocol):
    """Where a local run reports: a live terminal view or plain lines."""

    def attempt(self, attempt: int, nodes: Sequence[NodeProcess], pids: Sequence[int]) -> None: ...
    def output(self, rank: int, stream: str, text: str) -> None: ...
    def record(self, record: dict[str, Any]) -> None: ...
    def notice(self, text: str) -> None: ...


class NodeStartError(RuntimeError):
    pass


def _now() -> datetime:
    """Whole seconds, as the API server keeps every time in a status (metav1.Time) and as the fold
    keeps rank 0's record times: comparisons between them (the node blamed, hang detection) then
    come out as on a cluster."""
    return datetime.now(UTC).replace(microsecond=0)


@dataclass
class _Node:
    """One node process: a pod of one attempt."""

    spec: NodeProcess
    attempt: int
    tree: ProcessTree
    started: datetime
    master_port: int
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    readers: list[threading.Thread] = field(default_factory=list)
    finished: datetime | None = None
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=MESSAGE_LINES))
    # From its torchrun agent's records (runtime/agent/inplace.py), as a pod's readiness probe and log
    # tell the operator: running the workers of its attempt (`launch`), or holding a failed gang.
    ready: bool = False
    held: GangFailure | None = None

    def view(self, job_uid: str) -> PodView:
        code = self.tree.proc.returncode if self.finished is not None else None
        if code is not None and code < 0:
            code = SIGNAL_EXIT_BASE - code  # killed by signal N: 128+N, as container runtimes report
        failed = code not in (None, 0)
        return PodView(
            name=self.spec.pod_name,
            uid=self.uid,
            job_uid=job_uid,
            rank=self.spec.rank,
            attempt=self.attempt,
            phase="Running" if code is None else "Failed" if failed else "Succeeded",
            terminating=False,
            created=self.started,
            exit_code=code,
            reason=("Error" if failed else "Completed") if code is not None else None,
            message="\n".join(self.tail)[-MESSAGE_BYTES:] if failed else "",
            finished=self.finished,
            started=self.started,
            ready=self.ready and code is None,
            held=self.held,
        )


class Supervisor:
    def __init__(
        self, plan: LocalPlan, view: RunView, *, grace_s: float | None = None, policy: Policy = DEFAULT_POLICY
    ) -> None:
        self.plan = plan
        self.policy = policy
        self.view = view
        # As the kubelet does: SIGTERM, then SIGKILL after the pods' terminationGracePeriodSeconds,
        # in which the trainer checkpoints the step it is at (kubetrain.runtime.worker.stopping).
        self.grace_s = float(grace_seconds(plan.job)) if grace_s is None else grace_s
        # Set from another thread (kubetrain.client's Job.delete): stop every node, as a Ctrl-C does.
        self.stop_requested = threading.Event()
        # (attempt, rank) -> the phase its pod would have; see node_phases.
        self._phases: dict[tuple[int, int], str] = {}
        self.job = plan.job.model_copy(update={"status": TrainingJobStatus()})
        self.nodes: dict[str, _Node] = {}
        self.result = RunResult("Failed", "", plan.run_dir)
        self._lines: queue.Queue[tuple[_Node, str, str]] = queue.Queue()
        self._logs: dict[int, IO[str]] = {}
        self._attempt_logs: dict[tuple[int, int], IO[str]] = {}  # (attempt, rank) -> its own log
        self._ports: dict[int, int] = {}
        # attempt -> rank -> exit code of its stopped processes (the last attempt's go to the result).
        self._codes: dict[int, dict[int, int | None]] = {}
        self._started = time.monotonic()
        self._signal: int | None = None
        self._hurry = False
        self._published: tuple[dict[str, Any], float] = ({}, 0.0)

    @property
    def status(self) -> TrainingJobStatus:
        assert self.job.status is not None
        return self.job.status

    def node_phases(self) -> dict[tuple[int, int], str]:
        """(attempt, rank) -> the phase of every node process this run started, as its pod's phase
        would read: Running, then Succeeded or Failed once the process exited and all its output is
        in node-<rank>.log. A snapshot, safe to take from another thread."""
        return dict(self._phases)

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

    # --- the gang loop -------------------------------------------------------------------

    def run(self) -> RunResult:
        self._started = time.monotonic()
        try:
            with subreaper(), self._signals(), contextlib.ExitStack() as logs:
                for rank in range(self.plan.job.spec.nodes):
                    self._logs[rank] = logs.enter_context(open(self.plan.run_dir / f"node-{rank}.log", "a"))
                # The attempts of this run, numbered as its status.json numbers them; an earlier
                # run's output in this run dir stays in node-<i>.log.
                shutil.rmtree(self.plan.run_dir / ATTEMPTS_SUBDIR, ignore_errors=True)
                logs.callback(self._close_attempt_logs)
                try:
                    self._loop()
                finally:
                    self._stop(list(self.nodes.values()))
        finally:
            self.result.wall_s = time.monotonic() - self._started
            self._publish(force=True)
            self.result.absorb(self.status)
            if self._codes:
                codes = self._codes[max(self._codes)]
                self.result.node_exit_codes = [codes.get(rank) for rank in range(self.plan.job.spec.nodes)]
        return self.result

    def _loop(self) -> None:
        noted = 0.0
        while True:
            self._pump(POLL_S)
            if time.monotonic() - noted >= NOTE_GROUPS_EVERY_S:
                # Before a torchrun dies: afterwards its workers are no longer its descendants.
                note_groups([node.tree for node in self.nodes.values()])
                noted = time.monotonic()
            if self._signal is not None:
                name = signal.Signals(self._signal).name
                self.view.notice(f"{name}: stopping all nodes")
                self.result.outcome, self.result.reason, self.result.signal = "Interrupted", name, self._signal
                return
            if self.stop_requested.is_set():
                self.view.notice("stop requested: stopping all nodes")
                self.result.outcome, self.result.reason = "Interrupted", "Stopped"
                return
            self._reconcile()
            for outcome in ("Succeeded", "Failed"):
                if is_true(self.status, outcome):
                    self.result.outcome = outcome
                    # As the operator's next pass after its cleanup: counts without the stopped nodes.
                    self._reconcile()
                    return

    def _reconcile(self) -> None:
        now = datetime.now(UTC)  # decide keeps whole seconds but for the timeline
        exited = [node for node in self.nodes.values() if node.finished is None and not node.tree.running()]
        for node in exited:
            node.finished = now.replace(microsecond=0)
        # Its last lines (a `done` record, the error of a failed node) before its pod view.
        self._drain(exited, READ_TAIL_S)
        pods = []
        for node in self.nodes.values():
            pods.append(node.view(self.plan.uid))
            self._phases[(node.attempt, node.spec.rank)] = pods[-1].phase
        decision = decide(self.job, self.plan.uid, pods, True, now, self.policy)
        if forensics.wanted(self.status, decision.status):
            # As the operator does: every rank's stacks, from the node logs, name the one that hung.
            decision = decide(self.job, self.plan.uid, pods, True, now, self.policy, stacks=self._stacks())
        self._apply(decision)

    def _stacks(self) -> dict[int, RankStacks]:
        """The stacks in each node's log since its current attempt started."""
        hang = self.job.spec.run_policy.hang_timeout_seconds or 0
        logs = {}
        for rank, out in self._logs.items():
            out.flush()
            text = Path(out.name).read_text(errors="replace")
            logs[rank] = text.rsplit(ATTEMPT_BANNER, 1)[-1]
        return forensics.collect(logs, self.job.spec.procs_per_node, stacks_after_seconds(hang))

    def _apply(self, decision: Decision) -> None:
        """As the operator applies a Decision: the status first, then deletes, then creates."""
        restarted = decision.status.attempt > self.status.attempt
        self.job = self.job.model_copy(update={"status": decision.status})
        self._publish(force=decision.commit_first)
        for event in decision.events:
            if event.type == "Warning":
                self.view.notice(f"{event.reason}: {event.message}")
        if restarted:
            self.view.notice(self._resume_notice())
        doomed = {name for name, _ in decision.delete_pods}
        grace = decision.delete_grace_seconds
        self._stop([node for node in self.nodes.values() if node.spec.pod_name in doomed], grace)
        self._move(
            [node for node in self.nodes.values() if (node.spec.pod_name, node.uid) in decision.restart_in_place]
        )
        if decision.create_ranks:
            self._start(self.status.attempt, decision.create_ranks)

    def _resume_notice(self) -> str:
        checkpoint = self.status.last_checkpoint
        if checkpoint is not None:
            return f"the new attempt resumes from the last checkpoint: step {checkpoint.step}, {checkpoint.path}"
        return (
            "kubetrain saw no checkpoint record: the job starts again from the beginning, "
            "unless the script resumes from checkpoints it keeps itself"
        )

    # --- processes -----------------------------------------------------------------------

    def _start(self, attempt: int, ranks: Sequence[int]) -> None:
        # A node that joins a living node 0 (an elastic gang's) meets the store node 0's agent hosts.
        node0 = next((n for n in self.nodes.values() if n.spec.rank == 0), None)
        port = node0.master_port if node0 is not None else self._ports.setdefault(attempt, free_port())
        specs = [spec for spec in self.plan.nodes(attempt, master_port=port) if spec.rank in ranks]
        for spec in specs:
            self._logs[spec.rank].write(f"{ATTEMPT_BANNER}{attempt} ===\n")
            self._open_attempt_log(attempt, spec.rank)
            self._write_attempt(spec.rank, attempt)
            node = _Node(spec, attempt, self._launch(spec), _now(), port)
            self.nodes[spec.pod_name] = node
            self._phases[(attempt, spec.rank)] = "Running"
            for name, pipe in (("stdout", node.tree.proc.stdout), ("stderr", node.tree.proc.stderr)):
                node.readers.append(threading.Thread(target=self._read, args=(node, name, pipe), daemon=True))
                node.readers[-1].start()
        current = sorted((n for n in self.nodes.values() if n.attempt == attempt), key=lambda n: n.spec.rank)
        pids = [node.tree.pid for node in current]
        (self.plan.run_dir / "pids.json").write_text(json.dumps({"attempt": attempt, "pids": pids}) + "\n")
        self.view.attempt(attempt, [node.spec for node in current], pids)

    def _move(self, nodes: Sequence[_Node]) -> None:
        """An in-place restart: as the operator relabels the pods, write each node's attempt file;
        its torchrun agent restarts its workers as that attempt. The processes stay."""
        if not nodes:
            return
        attempt = self.status.attempt
        for node in nodes:
            self._close_attempt_logs((node.attempt, node.spec.rank))
            node.attempt, node.ready, node.held = attempt, False, None
            self._logs[node.spec.rank].write(f"{ATTEMPT_BANNER}{attempt} (in place) ===\n")
            self._open_attempt_log(attempt, node.spec.rank)
            self._write_attempt(node.spec.rank, attempt)
        current = sorted((n for n in self.nodes.values() if n.attempt == attempt), key=lambda n: n.spec.rank)
        self.view.attempt(attempt, [node.spec for node in current], [node.tree.pid for node in current])

    def _open_attempt_log(self, attempt: int, rank: int) -> None:
        """attempts/<attempt>/node-<rank>.log: this attempt's lines of the node (as the operator's
        archive keeps them). Closed when the node is stopped (_stop), or at the end of the run."""
        path = attempt_log(self.plan.run_dir, attempt, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._attempt_logs[attempt, rank] = open(path, "a")  # noqa: SIM115

    def _write_attempt(self, rank: int, attempt: int) -> None:
        """Atomically, as the kubelet updates a downward API file; an elastic gang's members first
        (the agent reads them once the attempt file names their attempt)."""
        path = self.plan.attempt_file(rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.status.members is not None:
            self._replace(path.with_name(MEMBERS_FILE), format_members(attempt, self.status.members))
        self._replace(path, str(attempt))

    @staticmethod
    def _replace(path: Path, text: str) -> None:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(f"{text}\n")
        os.replace(temporary, path)

    def _launch(self, spec: NodeProcess) -> ProcessTree:
        argv = spec.argv if spec.netns is None else ["ip", "netns", "exec", spec.netns, *spec.argv]
        try:
            return ProcessTree.start(
                argv,
                env=spec.full_env(),
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as error:
            raise NodeStartError(
                f"node {spec.rank}: cannot start {spec.argv[0]!r}: {error.strerror or error}"
            ) from None

    def _stop(self, nodes: Sequence[_Node], grace_s: float | None = None) -> None:
        """Stop these nodes' process trees (SIGKILL after `grace_s`, else the pods' grace
        period) and note their exit codes."""
        if not nodes:
            return
        started = time.monotonic()
        grace = self.grace_s if grace_s is None else grace_s
        live = stop([n.tree for n in nodes], grace, wait=lambda: self._pump(0.05), hurry=lambda: self._hurry)
        if live:
            self.view.notice(f"stopped {live} running node(s) in {time.monotonic() - started:.1f}s")
        self._drain(nodes, READ_TAIL_S)
        for node in nodes:
            del self.nodes[node.spec.pod_name]
            self._codes.setdefault(node.attempt, {})[node.spec.rank] = node.tree.proc.returncode
            self._phases[(node.attempt, node.spec.rank)] = "Succeeded" if node.tree.proc.returncode == 0 else "Failed"
            self._close_attempt_logs((node.attempt, node.spec.rank))

    # --- output --------------------------------------------------------------------------

    def _close_attempt_logs(self, *which: tuple[int, int]) -> None:
        """Close these (attempt, rank) logs; none named: all."""
        for key in which or list(self._attempt_logs):
            log = self._attempt_logs.pop(key, None)
            if log is not None:
                log.close()

    def _drain(self, nodes: Sequence[_Node], timeout_s: float) -> None:
        """Handle what exited nodes wrote. Their pipes close when the last process holding them
        exits: an orphaned worker may keep one open, so the wait is bounded."""
        deadline = time.monotonic() + timeout_s
        for node in nodes:
            for reader in node.readers:
                reader.join(timeout=max(0.0, deadline - time.monotonic()))
        self._pump(0)

    def _read(self, node: _Node, stream: str, pipe: IO[bytes]) -> None:
        with pipe:
            for raw in pipe:
                self._lines.put((node, stream, raw.decode("utf-8", "replace").rstrip("\r\n")))

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

    def _handle_line(self, node: _Node, stream: str, text: str) -> None:
        rank = node.spec.rank
        for log in (self._logs[rank], self._attempt_logs.get((node.attempt, rank))):
            if log is not None:
                log.write(text + "\n")
                log.flush()
        node.tail.append(text)
        record = parse_record(text) if stream == "stdout" else None
        if record is not None and record["event"] in AGENT_EVENTS:
            self._agent_record(node, record, text)
        if record is None or rank != 0:
            if record is None or record["event"] not in AGENT_EVENTS:
                self.view.output(rank, stream, text)
            return
        if node.attempt == self.status.attempt:
            # The operator reads the current attempt's rank 0 log; so does this.
            status = self.status
            status.progress, status.last_checkpoint = fold(text, status.progress, status.last_checkpoint)
            status.timeline = fold_timeline(text, status.timeline)
            self._publish()
        if record["event"] in (REFUSED, SKIPPED):  # a refusal is a stale attempt's: whichever attempt the node runs
            self._checkpoint_notes(text)
        if record["event"] not in AGENT_EVENTS:
            self.result.observe(record, time.monotonic() - self._started)
            self.view.record(record)

    def _checkpoint_notes(self, text: str) -> None:
        """A commit the object store refused, or one a resume walked back past: as the operator
        records them (lastCheckpointRefusal, lastCheckpointSkipped) and posts each Warning Event
        once, status.json holds them and a warning line shows each once."""
        before = self.status.model_copy()
        self.status.last_checkpoint_refusal = fold_refusal(text, before.last_checkpoint_refusal)
        self.status.last_checkpoint_skipped = fold_skip(text, before.last_checkpoint_skipped)
        events = refusal_events(before, self.status)
        for event in events:
            self.view.notice(f"{event.reason}: {event.message}")
        if events:
            self._publish(force=True)

    def _agent_record(self, node: _Node, record: dict[str, Any], text: str) -> None:
        """A node's torchrun agent started the workers of its attempt, or holds a failed gang:
        what a pod's readiness and log tell the operator."""
        if record.get("attempt") != node.attempt:
            return
        if record["event"] in ("launch", "standby"):
            node.ready = True
        else:
            node.ready, node.held = False, gang_failure(text, node.attempt)

    def _publish(self, *, force: bool = False) -> None:
        """Write status.json when it changed (progress at most every PUBLISH_EVERY_S)."""
        wire = self.status.wire()
        last, when = self._published
        if wire == last or (not force and time.monotonic() - when < PUBLISH_EVERY_S):
            return
        path = self.plan.run_dir / STATUS_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(wire, indent=2) + "\n")
        os.replace(temporary, path)
        self._published = (wire, time.monotonic())
