"""The in-place gang restart, inside torchrun's elastic agent (each node's long-lived process).

With runPolicy.restartStrategy InPlace the operator renders KUBETRAIN_ATTEMPT_FILE (the pod's
attempt label, projected by the downward API), KUBETRAIN_AGENT_PORT (the port of the pod's
readiness probe and of the operator's orders), KUBETRAIN_POD_IP and KUBETRAIN_AGENT_TOKEN (the
job's Secret); `kubetrain run --local` gives each node process the attempt file only, which it
writes itself. Loaded by kubetrain.runtime.torchrun_hooks when torch's agent is imported, this
makes the agent:

1. start its workers as the attempt the file names: torchrun's restart count is that attempt, so
   every node's workers key the rendezvous store alike, and each worker is a fork of the warm
   agent (runtime/agent/warmstart.py); then answer Ready on the agent port (`AgentPort`) and print a
   `launch` record;
2. when one of its workers fails, or another node's agent reports a failure of the same attempt
   in the rendezvous store torchrun's agents already share (checked every monitor interval):
   stop its workers and answer NotReady, register what it saw in the store, and once
   every agent registered (or CONSOLIDATE_S passed) print a `failure` record naming the gang's
   first failure: its node, process rank, exit code, reason (OOMKilled when the pod's cgroup
   counted an OOM kill meanwhile) and message. The first is a cause before a consequence (a
   worker whose error says its peer's connection went away (survivor.PEER_LOST) died because another
   did), then the worker that died first (timed by ExitTimes), then the lowest node;
3. hold until the operator orders a later attempt: its decision (operator/status.py `decide`:
   counted, judged by the failure policy), applied by relabelling the living pods and by a
   signed order to each pod's agent port (operator/agent_io.py). The order is the fast path; the
   label, through the attempt file, is the fallback for an order that did not arrive (the
   kubelet refreshes the file on its own schedule, which has no bound). Then start the workers
   as that attempt. An order while the workers run (the operator restarting a stalled gang)
   stops them and starts the new attempt the same way. The first agent that learns the attempt
   relays it through the store, so one agent reached late does not hold the gang back.

Where the decision is not an in-place restart (a FailJob rule, no restarts left, a pod lost)
the pods are deleted and the agent ends with them. The agents never restart on their own.
Like torchrun_hooks this uses torch's private agent names, through kubetrain.runtime.torch_private:
a torch without them, or with other parameters, gets torchrun's own behaviour (the gang is then
recreated on a failure), reported as a RuntimeFallback.
"""

from __future__ import annotations

import contextlib
import hmac
import http.server
import json
import logging
import os
import signal
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from kubetrain.api.contract import (
    AGENT_PORT_ENV,
    AGENT_TOKEN_ENV,
    ATTEMPT_ENV,
    ATTEMPT_FILE_ENV,
    MEMBERS_FILE,
    NNODES,
    NODE_RANK,
    ORDER_PATH,
    PET_PREFIX,
    POD_IP_ENV,
    READY_PATH,
    format_members,
    order_signature,
    parse_members,
)
from kubetrain.runtime import reach, records, torch_private
from kubetrain.runtime.agent import warmstart
from kubetrain.runtime.store import (
    abandoned_key,
    armed_key,
    failed_key,
    gang_attempt,
    go_key,
    joined_key,
    next_attempt_key,
    registered_key,
    report_key,
)
from kubetrain.runtime.worker import survivor

log = logging.getLogger("kubetrain.agent")

POLL_S = 0.05  # how often a holding agent reads the attempt file
HOLD_REPORT_S = 10.0  # how often a holding agent says it still waits
# How long a stopped agent waits for the others to register before it reports alone. Every agent
# registers within a monitor interval (0.1 s) or two, so the wait ends long before this; it runs
# out only where an agent is gone (its pod is failing anyway) or a loaded node lags by seconds.
CONSOLIDATE_S = 5.0
GATHER_CONNECT_S = 300  # how long a new member of an elastic gang tries to reach node 0's store
MESSAGE_BYTES = 2048
MAX_ORDER_BYTES = 1024
STOP_TIMEOUT_S = 10  # for a killed worker to be reaped (one in uninterruptible sleep may never be)
SIGNAL_EXIT_BASE = 128  # a worker killed by signal N reports 128+N, as container runtimes do
OOM_EVENTS = (Path("/sys/fs/cgroup/memory.events"), Path("/sys/fs/cgroup/memory/memory.oom_control"))
# What a store call raises when its host is gone or a value is bad. Never a broader class: torchrun
# turns SIGTERM into an Exception (SignalException) raised wherever the agent is, and one caught
# here would leave the pod's agent running until its grace period ran out.
STORE_ERRORS = (RuntimeError, OSError, ValueError)


def enabled() -> bool:
    return bool(os.environ.get(ATTEMPT_FILE_ENV))


def read_attempt(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def read_members(path: Path) -> tuple[int, list[int]] | None:
    """An elastic gang's members file (the pod's members annotation): (attempt, members), or None
    where there is none (a gang of a fixed size)."""
    try:
        return parse_members(path.read_text())
    except OSError:
        return None


def oom_kills() -> int:
    """The OOM kills counted in this process's memory cgroup (cgroup v2 or v1), 0 if unreadable."""
    for path in OOM_EVENTS:
        with contextlib.suppress(OSError, ValueError):
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


class AgentPort:
    """The agent port, served by a thread of its own from the first start of the workers:
    - `GET /ready` answers 200 while the workers of the current attempt run, 503 otherwise (the
      pod's readiness probe);
    - `POST /attempt` takes the operator's order of the next attempt, {"attempt": N, "signature":
      order_signature(token, N)}: the operator's decision reaches the agent over the pod network,
      whatever the kubelet does with the pod's attempt file. Without a token no order is taken.
    The thread only sets attributes and writes nothing: the main thread forks workers, and a
    fork while another thread holds an output stream's lock would leave the worker stuck on it."""

    def __init__(self, port: int | None, host: str, token: str) -> None:
        self.port = port
        self.host = host or "0.0.0.0"
        self.token = token
        self.ready = False
        self.ordered: int | None = None
        self.members: dict[int, list[int]] = {}  # attempt -> its members, from orders of an elastic gang
        self.refused: list[str] = []  # why orders were refused, for the main thread to log
        self.server: _Server | None = None

    def open(self) -> None:
        if self.port is None or self.server is not None:
            return
        handler = _handler(self)
        server_class = _Server6 if ":" in self.host else _Server
        try:
            self.server = server_class((self.host, self.port), handler)
        except OSError as error:
            log.warning(
                "the agent port %s:%d cannot be opened (%s): the pod will not turn Ready", self.host, self.port, error
            )
            return
        threading.Thread(target=self.server.serve_forever, name="kubetrain-agent-port", daemon=True).start()

    def order(self, body: bytes) -> tuple[int, str]:
        """An order's answer (HTTP status, text)."""
        if not self.token:
            return 403, "this agent takes no orders (no agent token)"
        try:
            order = json.loads(body)
            attempt, signature = int(order["attempt"]), str(order["signature"])
            members = None if order.get("members") is None else [int(rank) for rank in order["members"]]
        except (ValueError, KeyError, TypeError):
            return 400, 'expected {"attempt": N, "signature": "...", "members": [...] (elastic gangs)}'
        if not hmac.compare_digest(signature, order_signature(self.token, attempt, members)):
            self.refused.append(f"an order of attempt {attempt} with a wrong signature")
            return 403, "wrong signature"
        if members is not None:
            self.members[attempt] = members  # before `ordered`: the main thread reads them in that order
        if self.ordered is None or attempt > self.ordered:
            self.ordered = attempt
        return 202, f"attempt {attempt} ordered"

    def take_refusals(self) -> list[str]:
        taken, self.refused = self.refused, []
        return taken


class _Server(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:
        # Not HTTPServer's: it looks the address up in DNS (socket.getfqdn), seconds where the
        # pod's resolver does not answer, and nothing here uses the name.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class _Server6(_Server):
    address_family = socket.AF_INET6


def _handler(port: AgentPort) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != READY_PATH:
                self._answer(404, "not found")
            else:
                self._answer(200 if port.ready else 503, "ready" if port.ready else "not running the workers")

        def do_POST(self) -> None:
            if self.path != ORDER_PATH:
                self._answer(404, "not found")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_ORDER_BYTES:
                self._answer(413, "too long")
                return
            self._answer(*port.order(self.rfile.read(length)))

        def _answer(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # silent: see AgentPort
            return

    return Handler


def stop(agent: Any, group: Any) -> None:
    """Kill the workers at once: the gang is broken (its state is the last checkpoint), and a
    worker asked politely may wait out a collective with a peer that is gone."""
    torch_private.stop_workers(agent, group, death_sig=signal.SIGKILL, timeout=STOP_TIMEOUT_S)


def error_text(message: Any) -> str:
    """A worker failure's message as torch's ProcessFailure holds it: its text, or the error file's
    {"message": ..., "extraInfo": {"py_callstack": ...}} (then the traceback's end comes first)."""
    if isinstance(message, dict):
        text = str(message.get("message", ""))
        extra = message.get("extraInfo")
        stack = str(extra.get("py_callstack", "")) if isinstance(extra, dict) else ""
        return f"{text}\n{stack.strip()}" if stack.strip() else text
    text = str(message)
    return "" if text.startswith("To enable traceback") else text  # torch's text when there is no error file


def peer_lost(message: Any) -> bool:
    """Whether a worker's error says a peer process went away under it (survivor.PEER_LOST)."""
    return survivor.peer_lost(error_text(message))


def emit(event: str, **fields: Any) -> None:
    """One record on the agent's stdout (the pod's log), as the trainer prints its records; the
    attempt it belongs to is among `fields` (the agent's own, not KUBETRAIN_ATTEMPT's)."""
    records.write(event, fields, stream=sys.stdout, attempt_from_env=False)


class ExitTimes:
    """When each worker process died, to the millisecond: a thread per worker waits for its exit
    without reaping it (waitid with WNOWAIT; torchrun still reaps it). The gang's first failure is
    then told by when its process died, not by when its agent next looked: torchrun polls every
    monitor interval, and a peer whose collective failed because of that death (gloo's
    "Connection closed by peer") may be seen first and blamed instead."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}

    def watch(self, pids: list[int]) -> None:
        for pid in pids:
            threading.Thread(target=self._wait, args=(pid,), name=f"exit-{pid}", daemon=True).start()

    def _wait(self, pid: int) -> None:
        with contextlib.suppress(ChildProcessError):  # reaped first: the time it was seen is close
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        self.times.setdefault(pid, time.time())

    def of(self, pid: int) -> float:
        return self.times.get(pid, time.time())

    def wait(self, pids: list[int], timeout: float) -> bool:
        """Until every one of `pids` has exited (True) or `timeout` passed (False)."""
        deadline = time.monotonic() + timeout
        while any(pid not in self.times for pid in pids):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True


class InPlace:
    """One agent's side of the protocol (see the module docstring)."""

    def __init__(self) -> None:
        self.path = os.environ[ATTEMPT_FILE_ENV]
        port = os.environ.get(AGENT_PORT_ENV, "")
        # Popped: the workers, which inherit this environment, never see the token.
        token = os.environ.pop(AGENT_TOKEN_ENV, "")
        self.port = AgentPort(int(port) if port.isdigit() else None, os.environ.get(POD_IP_ENV, ""), token)
        self.port.open()
        found = read_attempt(self.path)
        self.attempt = found if found is not None else (gang_attempt() or 0)
        # An elastic gang (spec.elastic): which nodes train in each attempt (kubetrain.operator.elastic).
        self.members_path = Path(self.path).with_name(MEMBERS_FILE)
        self.known: dict[int, list[int]] = {}
        self.node: int | None = None  # this pod's node rank, whatever its rank in a gang (from its first rendezvous)
        self.run_id: str | None = None  # the rendezvous's own, before any attempt's
        self.store: Any = None  # node 0's store, for an elastic gang's gathering (`_gang_store`)
        self.preloaded = False
        self.group: Any = None  # torchrun's worker group, from its first rendezvous on (`patch_agent`)
        self.oom_kills = 0
        self.exits = ExitTimes()

    # --- starting the workers -------------------------------------------------------------

    def before_start(self, agent: Any, group: Any) -> None:
        # torchrun's restart count becomes the attempt: the same on every node of the gang.
        torch_private.set_remaining_restarts(agent, group.spec.max_restarts - self.attempt)
        os.environ[ATTEMPT_ENV] = str(self.attempt)
        self.preload(group)
        self.oom_kills = oom_kills()

    def preload(self, group: Any) -> None:
        """Import the workers' modules into the agent once (runtime/agent/warmstart.py): before their
        first start, or on standby, where a node joining an elastic gang would otherwise import
        them while the gang waits for it."""
        if not self.preloaded:
            self.preloaded = True
            took = warmstart.preload([group.spec.entrypoint, *map(str, group.spec.args)])
            log.info("workers' modules preloaded into the agent in %.2f s", took)

    def after_start(self, group: Any, pids: dict[int, Any]) -> None:
        # `pids` (local rank -> pid) is what torch's _start_workers returns; it sets the workers'
        # ids from it only after this hook, so group.workers cannot be read for them yet.
        self.exits.watch([pid for pid in pids.values() if isinstance(pid, int)])
        self.port.ready = True
        emit("launch", attempt=self.attempt, node=self.node_of(group), workers=len(group.workers))

    # --- the monitor loop ----------------------------------------------------------------

    def monitor(self, agent: Any, group: Any, result: Any, states: Any, poll: Callable[[], Any]) -> Any:
        """torchrun's verdict on its workers (`result`, `poll()` for a fresh one), or HEALTHY
        after an in-place restart."""
        for refused in self.port.take_refusals():
            log.warning("refused %s", refused)
        if result.state == states.SUCCEEDED:
            return result
        newer = self._ordered(group.store)
        if newer is not None:
            log.warning("attempt %d ordered while attempt %d runs: restarting the workers", newer, self.attempt)
            self.port.ready = False
            if self.membership(newer) != self.membership(self.attempt):
                self._resize_stop(agent, group)
            else:
                if self._peer_failed(group.store):
                    # The operator decided on another node's report before this agent looked: a
                    # survivor here may be saving the last step (seen in CI under load).
                    self._await_survivors(group)
                stop(agent, group)
            return self._start(agent, group, newer, result)
        own = result.state in (states.FAILED, states.UNHEALTHY)
        if not own:
            if not self._peer_failed(group.store):
                return result
            # A peer failed. If that followed from our own worker's death (its peer saw the
            # connection close), our worker is dead by now although the verdict above missed it:
            # ask torchrun again, so that death is reported as ours.
            result = poll()
            own = result.state in (states.FAILED, states.UNHEALTHY)
        self.port.ready = False
        self._await_survivors(group)
        stop(agent, group)
        self._register(group, result if own else None)
        failure = self._consolidate(group)
        if failure is not None:
            emit("failure", attempt=self.attempt, reported_by=self.node_of(group), **failure)
        return self._start(agent, group, self._hold(group.store), result)

    def _start(self, agent: Any, group: Any, attempt: int, result: Any) -> Any:
        self.attempt = attempt
        torch_private.initialize_workers(agent, group)  # the static rendezvous again, then our before/after hooks
        return type(result)(state=group.state)

    def _await_survivors(self, group: Any) -> None:
        """Once the attempt's trainer armed the survivor's save (kubetrain.runtime.worker.survivor), give the
        workers up to its grace to save the last step and exit on their own."""
        try:
            armed = group.store.check([armed_key(self.attempt)])
        except STORE_ERRORS:  # node 0's agent gone: the survivors save without an election
            armed = True
        if not armed:
            return
        pids = [worker.id for worker in group.workers if isinstance(worker.id, int)]
        started = time.monotonic()
        if self.exits.wait(pids, survivor.grace_s()):
            log.info("the workers exited on their own in %.2f s", time.monotonic() - started)
        else:
            log.warning("workers still running %.0f s after the gang's failure: killing them", survivor.grace_s())

    def _resize_stop(self, agent: Any, group: Any) -> None:
        """The gang changes size while it trains: SIGTERM, so the trainer's stop vote saves the step it
        is at (or, where a member is gone, the survivor's save does), then SIGKILL after the grace."""
        log.warning("the gang changes size: stopping the workers at a step boundary (SIGTERM)")
        torch_private.stop_workers(agent, group, death_sig=signal.SIGTERM, timeout=survivor.grace_s())

    # --- an elastic gang's members --------------------------------------------------------

    def node_of(self, group: Any) -> int:
        """This pod's node rank: its rank in the gang unless an elastic gang renumbered it."""
        return self.node if self.node is not None else int(group.group_rank)

    def elastic(self) -> bool:
        return bool(self.known) or read_members(self.members_path) is not None

    def membership(self, attempt: int) -> list[int] | None:
        """The node ranks of `attempt`'s gang, where the operator named them (an elastic gang)."""
        if attempt in self.known:
            return self.known[attempt]
        ordered = self.port.members.get(attempt)
        if ordered is None:
            found = read_members(self.members_path)
            ordered = found[1] if found is not None and found[0] == attempt else None
        if ordered is not None:
            self.known[attempt] = ordered
        return ordered

    def join(self, rendezvous: Any) -> None:
        """Before each rendezvous of an elastic gang: wait until an attempt names this node (on
        standby meanwhile: Ready, and a `standby` record), then until every member of it is there
        too (`_gathered`), then meet them at this node's rank among them."""
        own = torch_private.rendezvous_membership(rendezvous)
        if own is None:
            return
        if self.run_id is None:
            self.node, self.run_id = own[0], own[2]
        if not self.elastic():
            return
        while True:
            members = self._await_membership()
            store = torch_private.rendezvous_store(rendezvous) or self._gang_store(rendezvous)
            if store is None or self._gathered(store, members):
                break
        assert self.node is not None
        rank = members.index(self.node)
        torch_private.set_rendezvous_membership(rendezvous, rank, len(members), f"{self.run_id}-attempt-{self.attempt}")
        # The workers inherit this environment: a script that reads NODE_RANK or NNODES (the pod's
        # place in the range, as rendered) sees the gang it trains in, as GROUP_RANK says.
        for name, value in ((NODE_RANK, rank), (NNODES, len(members))):
            os.environ[name] = os.environ[PET_PREFIX + name] = str(value)
        log.info("attempt %d: node %d is rank %d of %d nodes", self.attempt, self.node, rank, len(members))

    def _await_membership(self) -> list[int]:
        """The members of the first attempt from this one on that names this node."""
        announced = None
        while True:
            members = self.membership(self.attempt)
            if members is not None and self.node in members:
                return members
            if members is not None and announced != self.attempt:
                if self.group is not None:
                    self.preload(self.group)  # on standby: before it is Ready to join
                announced = self.attempt
                self.port.ready = True
                emit("standby", attempt=self.attempt, node=self.node)
                log.info("attempt %d trains on nodes %s: node %s waits on standby", self.attempt, members, self.node)
            newer = self._ordered(None)
            if newer is not None:
                self.attempt = newer
                self.port.ready = False
            else:
                time.sleep(POLL_S)

    def _gang_store(self, rendezvous: Any) -> Any:
        """A client of node 0's store for the gathering, before torch's rendezvous connected one;
        on node 0 its server, which torch's rendezvous then shares (a multi-tenant TCPStore, as
        torch's static rendezvous makes it)."""
        if self.store is not None:
            return self.store
        master = torch_private.rendezvous_master(rendezvous, torch_private.RESIZE)
        if master is None:
            return None
        try:
            from datetime import timedelta

            from torch.distributed import TCPStore  # type: ignore[attr-defined]

            self.store = TCPStore(
                master[0],
                master[1],
                is_master=self.node == 0,
                timeout=timedelta(seconds=GATHER_CONNECT_S),
                wait_for_workers=False,
                multi_tenant=True,
            )
        except (*STORE_ERRORS, ImportError) as error:
            log.warning("could not reach node 0's store to gather the gang: %s", error)
        return self.store

    def _gathered(self, store: Any, members: list[int]) -> bool:
        """Whether every member of the attempt came to its rendezvous (True), or the attempt was
        abandoned for a later one (False: self.attempt is that one now). torch's rendezvous blocks,
        deaf to orders, until every member comes: a member lost meanwhile would hold the others
        there until torch's timeout (minutes). So each member registers in node 0's store and node
        0 decides, once: `go` when all are there, or `abandoned` when a later attempt is ordered
        first. The others wait for that decision in Python, and follow it."""
        assert self.node is not None
        run_id = str(self.run_id)  # `join` set it before any gathering
        keys = [joined_key(run_id, self.attempt, node) for node in members]
        go, abandoned = go_key(run_id, self.attempt), abandoned_key(run_id, self.attempt)
        try:
            store.set(keys[members.index(self.node)], "1")
            while True:
                if self.node == members[0]:
                    if store.check(keys):
                        store.set(go, "1")
                        return True
                    newer = self._ordered(None)
                    if newer is not None:
                        store.set(abandoned, "1")
                        return self._abandon(newer)
                elif store.check([go]):
                    return True
                elif store.check([abandoned]):
                    return self._abandon(self._await_order())
                time.sleep(POLL_S)
        except STORE_ERRORS as error:  # node 0's store gone: torch's rendezvous says it better
            log.warning("could not gather attempt %d's members in the store: %s", self.attempt, error)
        return True

    def _abandon(self, newer: int) -> bool:
        log.warning("attempt %d ordered before attempt %d's gang met: that one is abandoned", newer, self.attempt)
        self.attempt = newer
        return False

    def _await_order(self) -> int:
        """The next attempt the operator orders (node 0 abandoned this one for it)."""
        while True:
            newer = self._ordered(None)
            if newer is not None:
                return newer
            time.sleep(POLL_S)

    def _peer_failed(self, store: Any) -> bool:
        try:
            return int(store.add(failed_key(self.attempt), 0)) > 0
        except STORE_ERRORS:  # the store's host (node 0's agent) gone: its pod is failing anyway
            return False

    def _register(self, group: Any, result: Any) -> None:
        entry: dict[str, Any] = {"node": self.node_of(group), "time": time.time(), "failed": result is not None}
        if result is not None and result.failures:
            rank, failure = min(
                result.failures.items(), key=lambda item: (peer_lost(item[1].message), self.exits.of(item[1].pid))
            )
            code = failure.exitcode if failure.exitcode >= 0 else SIGNAL_EXIT_BASE - failure.exitcode
            oom = failure.exitcode < 0 and oom_kills() > self.oom_kills
            detail = f"worker rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) exited with code {code}"
            message = error_text(failure.message)
            entry.update(
                time=self.exits.of(failure.pid),
                consequence=peer_lost(failure.message),
                rank=rank,
                exit_code=code,
                reason="OOMKilled" if oom else "Error",
                message=(f"{detail}: {message}" if message else detail)[-MESSAGE_BYTES:],
            )
        store = group.store
        try:
            store.set(report_key(self.attempt, group.group_rank), json.dumps(entry))
            if entry["failed"]:
                store.add(failed_key(self.attempt), 1)
            store.add(registered_key(self.attempt), 1)
        except STORE_ERRORS as error:
            log.warning("could not register the failure in the rendezvous store: %s", error)

    def _consolidate(self, group: Any) -> dict[str, Any] | None:
        """The gang's first failure once every agent registered (or CONSOLIDATE_S passed)."""
        store, world = group.store, group.group_world_size
        deadline = time.monotonic() + CONSOLIDATE_S
        entries: list[dict[str, Any]] = []
        try:
            while int(store.add(registered_key(self.attempt), 0)) < world and time.monotonic() < deadline:
                time.sleep(0.02)
            for node in range(world):
                key = report_key(self.attempt, node)
                if store.check([key]):
                    entries.append(json.loads(store.get(key)))
        except STORE_ERRORS as error:
            log.warning("could not read the other agents' reports: %s", error)
        failed = [e for e in entries if e.get("failed") and "exit_code" in e]
        if not failed:
            return None
        first = min(failed, key=lambda e: (bool(e.get("consequence")), e["time"], e["node"]))
        return {key: first[key] for key in ("time", "node", "rank", "exit_code", "reason", "message")}

    def _ordered(self, store: Any) -> int | None:
        """The attempt after this one once the operator ordered it: by its order to the agent
        port, or named by this pod's attempt file (either is then relayed to the other agents
        through the store), or relayed by another agent that learnt it first. The file alone is
        not enough: each pod's file is refreshed by its own kubelet, on that kubelet's schedule,
        within a second as a rule, but a volume refresh may wait for the pod's next periodic
        sync (a minute or more; seen in CI), and no Kubernetes release promises a bound. An
        elastic gang's attempt counts once its members are known too (`membership`). `store`
        None: an agent on standby, not connected to the gang's store yet."""
        relay = next_attempt_key(self.attempt)
        ordered, named = self.port.ordered, read_attempt(self.path)
        elastic = self.elastic()
        for own in (ordered, named):  # the operator's order first: it does not wait on the kubelet
            if own is None or own <= self.attempt:
                continue
            members = self.membership(own)
            if elastic and members is None:
                continue  # its members come with the order, or in the file beside the attempt's
            if store is not None:
                with contextlib.suppress(*STORE_ERRORS):
                    store.set(relay, str(own) if members is None else format_members(own, members))
            return own
        if store is None:
            return None
        try:
            text = store.get(relay).decode() if store.check([relay]) else ""
        except STORE_ERRORS:
            return None
        found = parse_members(text)
        relayed = found[0] if found is not None else int(text) if text.isdigit() else None
        if found is not None:
            self.known.setdefault(found[0], found[1])
        if relayed is not None and relayed > self.attempt:
            log.warning(
                "attempt %d named by another node's agent; this pod's attempt file still says %s", relayed, named
            )
            return relayed
        return None

    def _hold(self, store: Any) -> int:
        log.warning("attempt %d of the gang stopped; waiting for the operator to order the next", self.attempt)
        started = report = time.monotonic()
        while True:
            attempt = self._ordered(store)
            if attempt is not None:
                return attempt
            if time.monotonic() - report >= HOLD_REPORT_S:
                # The operator decides within seconds of the failure record: a wait this long
                # means its decision (or this pod's attempt file) is late; say so where it shows.
                report = time.monotonic()
                log.warning(
                    "attempt %d of the gang stopped %.0f s ago; no next attempt ordered yet (no order on the "
                    "agent port%s; %s says %s)",
                    self.attempt,
                    report - started,
                    "" if self.port.token else ": this agent has no token",
                    ATTEMPT_FILE_ENV,
                    read_attempt(self.path),
                )
            time.sleep(POLL_S)


# --- installing it into torch's agent ----------------------------------------------------

_STATE: list[InPlace] = []  # the one torchrun agent of this process, made on first use


def current() -> InPlace:
    if not _STATE:
        _STATE.append(InPlace())
    return _STATE[0]


def _state(agent: Any) -> InPlace:
    return current()


START_INSTEAD = "the workers start as torch alone starts them"


def patch_agent(module: ModuleType) -> None:
    """torch.distributed.elastic.agent.server.local_elastic_agent loaded: wrap the worker start
    and the monitor of LocalElasticAgent."""
    states = getattr(module, "WorkerState", None)
    if states is None:
        torch_private.fallback(torch_private.IN_PLACE, [f"{module.__name__}.WorkerState"])
        return

    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException as stopped
    except ImportError:
        stopped = KeyboardInterrupt  # type: ignore[assignment,misc]  # a torch without it: nothing to spare

    @contextlib.contextmanager
    def torchs_own(what_failed: str, instead: str) -> Iterator[None]:
        """A bug in kubetrain's part of the agent: logged, reported once (a `fallback` record), and
        torch's own behaviour goes on. A stop signal is torchrun's to handle, never caught."""
        try:
            yield
        except stopped:
            raise
        except Exception as error:
            log.exception("%s", what_failed)
            torch_private.failed(torch_private.IN_PLACE, error, instead)

    def wrap_start(start: Callable[..., Any]) -> Callable[..., Any]:
        def _start_workers(self: Any, worker_group: Any) -> Any:
            state = _state(self)
            with torchs_own("the in-place restart could not prepare the workers' start", START_INSTEAD):
                state.before_start(self, worker_group)
            started = torch_private.start_workers(start, self, worker_group)
            with torchs_own("the in-place restart could not follow the workers' start", START_INSTEAD):
                state.after_start(worker_group, started)
            return started

        return _start_workers

    def wrap_initialize(initialize: Callable[..., Any]) -> Callable[..., Any]:
        def _initialize_workers(self: Any, worker_group: Any) -> Any:
            _state(self).group = worker_group  # before the rendezvous, where a node may wait on standby
            return torch_private.initialize_workers(self, worker_group, initialize)

        return _initialize_workers

    def wrap_monitor(monitor: Callable[..., Any]) -> Callable[..., Any]:
        def _monitor_workers(self: Any, worker_group: Any) -> Any:
            def poll() -> Any:
                return torch_private.monitor_workers(monitor, self, worker_group)

            result = poll()
            with torchs_own("the in-place restart failed; the gang will be recreated", torch_private.IN_PLACE.instead):
                return _state(self).monitor(self, worker_group, result, states, poll)
            return result  # torchrun's own verdict: a failure then recreates the gang

        return _monitor_workers

    torch_private.usable(torch_private.KILL_AT_ONCE, module)  # a fallback said at start-up, not at the first stop
    # All or none: `patch` checks every name of the feature before the first.
    if torch_private.patch(module, torch_private.IN_PLACE, torch_private.START_WORKERS, wrap_start):
        torch_private.patch(module, torch_private.IN_PLACE, torch_private.MONITOR_WORKERS, wrap_monitor)
        torch_private.patch(module, torch_private.IN_PLACE, torch_private.INITIALIZE_WORKERS, wrap_initialize)


NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"


def patch_launch_config(module: ModuleType) -> None:
    """torch.distributed.launcher.api loaded: torchrun's LaunchConfig asks whether an accelerator is
    available when it is made, and the CUDA runtime's answer marks every later fork of the agent
    unable to use CUDA (measured on an H200: every warm worker failed "Cannot re-initialize CUDA in
    forked subprocess"). That one question goes to NVML instead, torch's own fork-safe check
    (NVML_CHECK_ENV); the workers, and anything else, get the CUDA runtime's answer as before."""

    def wrap(post_init: Callable[..., Any]) -> Callable[..., Any]:
        def __post_init__(self: Any) -> Any:
            if NVML_CHECK_ENV in os.environ:
                return post_init(self)
            os.environ[NVML_CHECK_ENV] = "1"
            try:
                return post_init(self)
            finally:
                os.environ.pop(NVML_CHECK_ENV, None)

        return __post_init__

    torch_private.patch(module, torch_private.NVML_CHECK, torch_private.LAUNCH_CONFIG_INIT, wrap)


def patch_handler(module: ModuleType) -> None:
    """torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler loaded:
    start Python workers as forks of the agent (runtime/agent/warmstart.py)."""

    def wrap(popen: Callable[..., Any]) -> Callable[..., Any]:
        def _popen(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
            if not torch_private.output_redirected(self):
                forked = warmstart.fork(args, env)
                if forked is not None:
                    return forked
            return torch_private.popen(popen, self, args, env)

        return _popen

    if torch_private.patch(module, torch_private.WARM_START, torch_private.POPEN, wrap):
        torch_private.usable(torch_private.FORK_CUDA_CHECK)  # said at start-up, not by a forked worker


def patch_static_rendezvous(module: ModuleType) -> None:
    """torch.distributed.elastic.rendezvous.static_tcp_rendezvous loaded: before a node other than
    0 connects to node 0's store, wait for node 0's name and port at a short fixed interval
    (runtime/reach.py); torch's own client retries a missing name with growing gaps. An elastic
    gang's attempt meets at its own rank and size first (`InPlace.join`)."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def next_rendezvous(self: Any) -> Any:
            if enabled():
                current().join(self)  # an elastic gang: this attempt's rank and size
            node0 = torch_private.node0_to_wait_for(self)
            if node0 is not None:
                with contextlib.suppress(reach.Unreachable):  # torch's own error says it better
                    reach.wait_for(*node0)
            return original(self)

        return next_rendezvous

    if not torch_private.patch(module, torch_private.NODE0_WAIT, torch_private.NEXT_RENDEZVOUS, wrap) and enabled():
        torch_private.usable(torch_private.RESIZE, module)  # said too: it needs the same wrapper
