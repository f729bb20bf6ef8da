"""The in-place restart's pieces inside torchrun's agent, without torchrun: the warm fork start,
the agent port (readiness and the operator's orders), the attempt file, and the one report of a
gang's first failure."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.stores import Store

from kubetrain.api.contract import order_signature
from kubetrain.runtime import reach
from kubetrain.runtime.agent import inplace, warmstart
from kubetrain.runtime.agent.inplace import AgentPort, InPlace, error_text, read_attempt
from kubetrain.runtime.store import armed_key
from kubetrain.runtime.worker import survivor

pytestmark = pytest.mark.unit
PY = sys.executable


@pytest.mark.parametrize(
    ("args", "parsed"),
    [
        ([PY, "-u", "-m", "kubetrain.trainer", "train"], ("module", "kubetrain.trainer", ["train"])),
        ([PY, "train.py", "--lr", "1"], ("script", "train.py", ["--lr", "1"])),
        ([PY, "-u", "-c", "print(1)"], None),  # not a script or a module: started the usual way
        (["/usr/bin/numactl", "--cpunodebind=0", PY, "x.py"], None),
        (["./train.sh"], None),
    ],
)
def test_which_command_lines_start_warm(args: list[str], parsed: tuple[str, str, list[str]] | None) -> None:
    assert warmstart.command(args) == parsed


def test_a_forked_worker_runs_its_script_with_its_own_env_argv_and_exit_code(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, signal, sys
            json.dump({{"argv": sys.argv, "env": os.environ.get("WORKER"), "path0": sys.path[0],
                        "pgid": os.getpgid(0) == os.getpid(),
                        "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}}, open({str(out)!r}, "w"))
            sys.exit(3)
            """
        )
    )
    # As torchrun's agent does: a handler of its own, which the worker must not inherit.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        forked = warmstart.fork([PY, "-u", str(script), "--lr", "1"], {"WORKER": "yes", "PATH": os.environ["PATH"]})
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert forked is not None
    assert forked.wait(60) == 3 and forked.poll() == 3
    seen = json.loads(out.read_text())
    assert seen["argv"] == [str(script), "--lr", "1"] and seen["env"] == "yes"
    assert seen["path0"] == str(tmp_path), "sys.path[0] is the script's directory, as for `python script.py`"
    assert seen["pgid"] and seen["sigterm"], "a session of its own, the agent's signal handlers gone"


@pytest.mark.parametrize(("gpus", "cold"), [(1, True), (0, False)])
def test_a_fork_of_an_agent_that_asked_cuda_runs_cold_where_there_are_gpus(
    tmp_path: Path, gpus: int, cold: bool
) -> None:
    """torch marks every fork of a process that asked the CUDA runtime for its devices (torchrun's
    launch config did, on an H200): the fork's first CUDA call raises. With GPUs such a worker
    runs its command line cold, in the same process; without, the mark is harmless and it stays warm."""
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import os, sys, torch\nprint('worker', os.getpid(), torch.cuda._is_in_bad_fork())\nsys.exit(5)\n"
    )
    agent_side = tmp_path / "agent.py"
    agent_side.write_text(
        textwrap.dedent(
            f"""
            import os, sys, torch
            from kubetrain.runtime.agent import warmstart
            torch._C._cuda_getDeviceCount()  # the question torchrun's launch config asks
            warmstart._gpus = lambda: {gpus}  # what the agent sees (this machine may have no GPU)
            forked = warmstart.fork([sys.executable, "-u", {str(worker)!r}], dict(os.environ))
            print("forked", forked.pid, forked.wait(60), flush=True)
            """
        )
    )
    done = subprocess.run([PY, str(agent_side)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    pid, code = lines["forked"].split()
    assert code == "5" and lines["worker"] == f"{pid} {not cold}", done.stdout
    assert ("starting the worker cold" in done.stderr) is cold


def _http(port: int, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method="GET" if data is None else "POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_forked_worker_dies_with_its_agent(tmp_path: Path) -> None:
    """A node's agent killed alone (locally: the OOM killer, a kill) takes its workers with it,
    as a container would; before, a worker held by a fault lived on, orphaned, for an hour."""
    worker = tmp_path / "worker.py"
    worker.write_text("import time\nwhile True:\n    time.sleep(3600)\n")
    agent_side = tmp_path / "agent.py"
    agent_side.write_text(
        textwrap.dedent(
            f"""
            import os, sys, time
            from kubetrain.runtime.agent import warmstart
            forked = warmstart.fork([sys.executable, "-u", {str(worker)!r}], dict(os.environ))
            print(forked.pid, flush=True)
            time.sleep(3600)
            """
        )
    )
    agent_proc = subprocess.Popen([PY, str(agent_side)], stdout=subprocess.PIPE, text=True)
    try:
        assert agent_proc.stdout is not None
        worker_pid = int(agent_proc.stdout.readline())
        assert _alive(worker_pid)
    finally:
        agent_proc.kill()
        agent_proc.wait(30)
    deadline = time.monotonic() + 30
    while _alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker_pid), "the worker outlived its agent"


def _alive(pid: int) -> bool:
    """Alive and not a zombie (a reaped-later child of a dead parent is no process any more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_forked_worker_closes_the_agents_sockets(tmp_path: Path) -> None:
    """A worker holding the agent port's listener would keep answering for its agent."""
    port = AgentPort(_free_port(), "127.0.0.1", "")
    port.open()
    script = tmp_path / "sleep.py"
    script.write_text("import os, time\nprint(sorted(os.listdir('/proc/self/fd')), flush=True)\ntime.sleep(30)\n")
    forked = warmstart.fork([PY, str(script)], dict(os.environ))
    assert forked is not None
    try:
        time.sleep(1.0)
        sockets = [
            fd
            for fd in os.listdir(f"/proc/{forked.pid}/fd")
            if os.readlink(f"/proc/{forked.pid}/fd/{fd}").startswith("socket:")
        ]
        assert sockets == []
    finally:
        forked.kill()
        forked.wait(10)
        assert port.server is not None
        port.server.shutdown()
        port.server.server_close()


def test_the_agent_port_answers_ready_only_while_the_workers_run() -> None:
    port = AgentPort(_free_port(), "127.0.0.1", "")
    port.open()
    assert port.port is not None and port.server is not None
    try:
        assert _http(port.port, "/ready")[0] == 503, "not Ready before the workers start"
        port.ready = True
        assert _http(port.port, "/ready")[0] == 200
        port.ready = False
        assert _http(port.port, "/ready")[0] == 503, "holding a failed gang: NotReady"
        assert _http(port.port, "/elsewhere")[0] == 404
    finally:
        port.server.shutdown()
        port.server.server_close()
    AgentPort(None, "", "").open()  # no port (kubetrain run --local): nothing listens


def test_the_agent_port_takes_only_orders_signed_with_the_jobs_token() -> None:
    port = AgentPort(_free_port(), "127.0.0.1", "s3cret")
    port.open()
    assert port.port is not None and port.server is not None
    try:
        assert _http(port.port, "/attempt", {"attempt": 2, "signature": order_signature("guess", 2)})[0] == 403
        assert _http(port.port, "/attempt", {"attempt": 2})[0] == 400
        assert port.ordered is None and port.take_refusals() == ["an order of attempt 2 with a wrong signature"]
        assert _http(port.port, "/attempt", {"attempt": 2, "signature": order_signature("s3cret", 2)})[0] == 202
        assert port.ordered == 2
        # An older order (a late retry) never moves the agent back.
        assert _http(port.port, "/attempt", {"attempt": 1, "signature": order_signature("s3cret", 1)})[0] == 202
        assert port.ordered == 2
    finally:
        port.server.shutdown()
        port.server.server_close()
    untrusting = AgentPort(None, "", "")
    assert untrusting.order(json.dumps({"attempt": 1, "signature": order_signature("", 1)}).encode())[0] == 403


def test_the_attempt_file(tmp_path: Path) -> None:
    path = tmp_path / "attempt"
    assert read_attempt(str(path)) is None
    path.write_text("3\n")
    assert read_attempt(str(path)) == 3
    path.write_text("")  # the kubelet swaps the file atomically, but never trust a read
    assert read_attempt(str(path)) is None


@pytest.mark.parametrize(
    ("message", "text"),
    [
        ("Signal 9 (SIGKILL) received by PID 7", "Signal 9 (SIGKILL) received by PID 7"),
        ("To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html", ""),
        (
            {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback ...\nRuntimeError: boom\n"}},
            "RuntimeError: boom\nTraceback ...\nRuntimeError: boom",
        ),
        ({"message": "ValueError: x"}, "ValueError: x"),
    ],
)
def test_a_failure_message_as_torch_holds_it(message: Any, text: str) -> None:
    assert error_text(message) == text


class Group:
    def __init__(self, store: Store, rank: int, world: int) -> None:
        self.store, self.group_rank, self.group_world_size = store, rank, world


class Failure:
    def __init__(self, local_rank: int, exitcode: int, timestamp: float, message: Any = "") -> None:
        self.local_rank, self.pid, self.exitcode, self.timestamp, self.message = (
            local_rank,
            100,
            exitcode,
            timestamp,
            message,
        )


class Result:
    def __init__(self, failures: dict[int, Failure]) -> None:
        self.failures = failures


def test_every_agent_reports_the_gangs_first_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 1's worker was killed; node 0's failed a moment later (its peer was gone); node 2 was
    stopped by the store's flag. Each agent's report names node 1, the earliest."""
    monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(tmp_path / "attempt"))
    (tmp_path / "attempt").write_text("0")
    store = Store()
    agents = [InPlace() for _ in range(3)]
    assert not agents[2]._peer_failed(store)
    agents[1]._register(Group(store, 1, 3), Result({1: Failure(0, -9, time.time())}))
    assert agents[2]._peer_failed(store), "the flag stops the healthy agents"
    agents[0]._register(Group(store, 0, 3), Result({0: Failure(0, 1, time.time(), {"message": "RuntimeError: gone"})}))
    agents[2]._register(Group(store, 2, 3), None)
    reports = [a._consolidate(Group(store, rank, 3)) for rank, a in enumerate(agents)]
    assert all(report == reports[0] for report in reports)
    first = reports[0]
    assert first is not None and (first["node"], first["rank"], first["exit_code"], first["reason"]) == (
        1,
        1,
        137,
        "Error",
    )
    assert first["message"].startswith("worker rank 1 (local rank 0, pid 100) exited with code 137")


def test_the_worker_that_died_first_is_blamed_whichever_agent_saw_its_death_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 1's worker exits 3; node 0's dies after it of the lost peer (gloo: "Connection closed
    by peer") and its agent happens to register first. The report names node 1: each agent times
    its workers' deaths as they happen (ExitTimes), not when it looked. The order is made, not
    waited for: node 0's worker starts only once node 1's death was timed."""
    monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(tmp_path / "attempt"))
    (tmp_path / "attempt").write_text("0")
    store = Store()
    agents = [InPlace(), InPlace()]

    def seen(*pids: int) -> None:
        # Reaped as torchrun reaps, after the watchers saw the deaths: on a loaded machine a watcher's
        # thread can start after its process was reaped, and then times the death when it looked.
        until = time.monotonic() + 30
        while set(pids) - {*agents[1].exits.times, *agents[0].exits.times}:
            assert time.monotonic() < until, "the watchers never saw the deaths"
            time.sleep(0.01)

    first = subprocess.Popen([PY, "-c", "import os; os._exit(3)"])
    agents[1].exits.watch([first.pid])
    seen(first.pid)
    second = subprocess.Popen([PY, "-c", "import os; os._exit(1)"])
    agents[0].exits.watch([second.pid])
    seen(second.pid)
    assert (second.wait(30), first.wait(30)) == (1, 3)
    peer_gone = Failure(0, 1, time.time(), {"message": "RuntimeError: Connection closed by peer"})
    peer_gone.pid = second.pid
    agents[0]._register(Group(store, 0, 2), Result({0: peer_gone}))
    crashed = Failure(0, 3, time.time())
    crashed.pid = first.pid
    agents[1]._register(Group(store, 1, 2), Result({1: crashed}))
    report = agents[0]._consolidate(Group(store, 0, 2))
    assert report is not None and (report["node"], report["exit_code"]) == (1, 3), report
    assert agents[0].exits.of(second.pid) > agents[1].exits.of(first.pid)


def test_a_worker_that_lost_its_peer_is_blamed_only_when_nobody_else_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 0's worker failed of the lost peer and its death was timed first (clocks of two nodes,
    a thread woken late): still node 1's exit 3 is the gang's failure, the cause before its
    consequence. Alone, the consequence is reported as it is."""
    monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(tmp_path / "attempt"))
    store = Store()
    agents = [InPlace(), InPlace()]
    lost = {"message": "RuntimeError: [pair.cc:561] Connection closed by peer [10.0.0.2]:4711."}
    agents[0]._register(Group(store, 0, 2), Result({0: Failure(0, 1, time.time(), lost)}))
    report = agents[0]._consolidate(Group(store, 0, 2))
    assert report is not None and (report["node"], report["exit_code"]) == (0, 1), "alone, it is reported"
    agents[1].exits.times[100] = time.time() + 0.05  # timed after node 0's, though it came first
    agents[1]._register(Group(store, 1, 2), Result({1: Failure(0, 3, time.time())}))
    for rank, one in enumerate(agents):
        report = one._consolidate(Group(store, rank, 2))
        assert report is not None and (report["node"], report["rank"], report["exit_code"]) == (1, 1, 3), report


@pytest.mark.parametrize(
    ("message", "lost"),
    [
        ({"message": "RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:31957."}, True),
        ("RuntimeError: [pair.cc:545] Read error [127.0.0.1]:45208: Connection reset by peer.", True),
        ({"message": "DistBackendError: NCCL error: remote process exited or there was a network error"}, True),
        ("Signal 9 (SIGKILL) received by PID 7", False),
        ({"message": "BrokenPipeError: [Errno 32] Broken pipe"}, False),  # its own stdout, not a peer
        ({"message": "RuntimeError: CUDA out of memory"}, False),
        ({"message": "RuntimeError: Timed out waiting 1800000ms for recv operation to complete"}, False),
        ("", False),
    ],
)
def test_which_errors_say_a_peer_went_away(message: Any, lost: bool) -> None:
    """A timeout is not one: the peer that never answered may be hung, not dead."""
    assert inplace.peer_lost(message) is lost


def test_a_report_does_not_wait_for_an_agent_that_never_registers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(tmp_path / "attempt"))
    monkeypatch.setattr(inplace, "CONSOLIDATE_S", 0.2)
    store = Store()
    one = InPlace()
    one._register(Group(store, 0, 2), Result({0: Failure(0, 2, time.time())}))
    started = time.monotonic()
    report = one._consolidate(Group(store, 0, 2))
    assert report is not None and report["exit_code"] == 2 and time.monotonic() - started < 2


def test_the_next_attempt_is_relayed_to_an_agent_whose_attempt_file_is_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 0's kubelet refreshed its pod's attempt file; node 1's has not yet (a volume refresh
    may wait for the kubelet's next periodic sync). Node 1's agent learns the attempt from node
    0's through the store they share, and only for the attempt that stopped."""
    files = [tmp_path / "attempt-0", tmp_path / "attempt-1"]
    agents = []
    for path in files:
        path.write_text("0")
        monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(path))
        agents.append(InPlace())
    store = Store()
    assert [a._ordered(store) for a in agents] == [None, None], "nothing ordered yet"
    files[0].write_text("1")
    assert agents[1]._ordered(store) is None, "not before an agent read it"
    assert agents[0]._ordered(store) == 1
    assert agents[1]._ordered(store) == 1, "relayed: its own file still says 0"
    assert agents[1]._hold(store) == 1
    # The relay names the attempt after 0 only: an agent already on attempt 1 waits for its own.
    agents[1].attempt = 1
    assert agents[1]._ordered(store) is None


@pytest.mark.timeout(60)  # without the order nothing names the next attempt: it would wait forever
def test_a_holding_agent_whose_attempt_file_never_changes_starts_the_attempt_the_operator_orders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet never refreshes either pod's attempt file: the operator's signed order to one
    agent's port starts it, and the other agent learns the attempt from it through the store."""
    store, ports, agents = Store(), [_free_port(), _free_port()], []
    for node, port in enumerate(ports):
        path = tmp_path / f"attempt-{node}"
        path.write_text("0")
        path.chmod(0o444)
        monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(path))
        monkeypatch.setenv("KUBETRAIN_AGENT_PORT", str(port))
        monkeypatch.setenv("KUBETRAIN_POD_IP", "127.0.0.1")
        monkeypatch.setenv("KUBETRAIN_AGENT_TOKEN", "s3cret")
        agents.append(InPlace())
        assert "KUBETRAIN_AGENT_TOKEN" not in os.environ, "taken out of what the workers inherit"
    try:
        assert [a._ordered(store) for a in agents] == [None, None]
        order = {"attempt": 1, "signature": order_signature("s3cret", 1)}
        assert _http(ports[0], "/attempt", order)[0] == 202
        started = time.monotonic()
        assert agents[0]._hold(store) == 1
        assert agents[1]._hold(store) == 1, "relayed through the store"
        assert time.monotonic() - started < 30, "long before the test's timeout (60 s)"
    finally:
        for one in agents:
            assert one.port.server is not None
            one.port.server.shutdown()
            one.port.server.server_close()


@pytest.mark.timeout(60)  # without the report nothing names the next attempt: it would wait forever
def test_a_holding_agent_says_how_long_it_has_waited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "attempt"
    path.write_text("0")
    monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(path))
    monkeypatch.setattr(inplace, "HOLD_REPORT_S", 0.1)
    one = InPlace()

    class NameTheNextOnceReported(logging.Handler):
        """The operator's decision arrives right after the first report (whatever the load)."""

        def emit(self, record: logging.LogRecord) -> None:
            if "no next attempt ordered yet" in record.getMessage():
                path.write_text("1")

    handler = NameTheNextOnceReported()
    logging.getLogger("kubetrain.agent").addHandler(handler)
    try:
        with caplog.at_level("WARNING", logger="kubetrain.agent"):
            assert one._hold(Store()) == 1
    finally:
        logging.getLogger("kubetrain.agent").removeHandler(handler)
    waits = [r.getMessage() for r in caplog.records if "no next attempt ordered yet" in r.getMessage()]
    assert waits and "KUBETRAIN_ATTEMPT_FILE says 0" in waits[0], waits


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_a_node_waits_for_node0_at_a_fixed_interval_before_torch_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's static rendezvous, patched: node 1 polls node 0's address every 0.1 s and only
    then lets torch's store client connect (which backs off with growing gaps on its own)."""
    import datetime
    import types

    port = _free_port()
    calls: list[float] = []
    # The gaps between polls as the poller asks for them (a loaded machine stretches a sleep, never
    # the interval asked for): read from its clock, not measured between threads.
    gaps: list[float] = []

    def sleep(seconds: float) -> None:
        gaps.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(reach, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep))

    class StaticTCPRendezvous:
        def __init__(self, rank: int) -> None:
            self.rank, self.master_addr, self.master_port = rank, "127.0.0.1", port
            self.timeout = datetime.timedelta(seconds=10)
            self._store = None

        def next_rendezvous(self) -> str:
            calls.append(time.monotonic())
            return "original"

    module = types.ModuleType("static_tcp_rendezvous")
    module.StaticTCPRendezvous = StaticTCPRendezvous  # type: ignore[attr-defined]
    inplace.patch_static_rendezvous(module)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    up: list[float] = []

    def node0_comes_up() -> None:
        time.sleep(0.6)
        up.append(time.monotonic())  # before it listens: no connect can succeed earlier
        listener.bind(("127.0.0.1", port))
        listener.listen(8)

    threading.Thread(target=node0_comes_up, daemon=True).start()
    try:
        assert StaticTCPRendezvous(1).next_rendezvous() == "original"
        assert calls[0] >= up[0], "torch's connect waited for node 0"
        assert gaps and set(gaps) == {reach.INTERVAL_S}, f"a fixed interval, not growing gaps: {gaps}"
        polls = len(gaps)
        node0 = StaticTCPRendezvous(0)
        assert node0.next_rendezvous() == "original" and len(gaps) == polls, "node 0 hosts: no wait"
    finally:
        listener.close()


def test_a_stop_signal_in_a_store_call_stops_the_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun turns SIGTERM into an exception raised wherever its agent is. One swallowed as a
    store error kept a pod's agent holding until its 120 s grace ran out (seen on the real node
    when a deleted pod's peer was deleted while its agent reported the gang's failure)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    class Stopping(Store):
        def add(self, key: str, amount: int) -> int:
            raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(tmp_path / "attempt"))
    one = InPlace()
    with pytest.raises(SignalException):
        one._peer_failed(Stopping())
    with pytest.raises(SignalException):
        one._register(Group(Stopping(), 0, 2), Result({0: Failure(0, 1, time.time())}))
    with pytest.raises(SignalException):
        one._consolidate(Group(Stopping(), 0, 2))


class Worker:
    def __init__(self, pid: int) -> None:
        self.id = pid


def test_an_agent_waits_for_armed_workers_to_save_and_exit_but_not_for_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After a gang failure the agent kills its workers at once, unless the attempt's trainer armed
    the survivor's save: then it gives them up to the grace to exit on their own."""
    monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(tmp_path / "attempt"))
    # A grace far longer than any load makes a step here: waiting it out, where the agent must not,
    # shows as minutes against seconds (no wall-clock margin between processes is asserted).
    monkeypatch.setenv(survivor.GRACE_ENV, "120")
    (tmp_path / "attempt").write_text("0")
    agent, store = InPlace(), Store()
    # The worker exits when the test closes its stdin: before that, only a wait could see it exit.
    saver = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert saver.stdin is not None
    group = Group(store, 0, 2)
    group.workers = [Worker(saver.pid)]  # type: ignore[attr-defined]
    agent.exits.watch([saver.pid])
    started = time.monotonic()
    agent._await_survivors(group)
    assert saver.poll() is None, "not armed: no wait (the worker still runs)"
    store.set(armed_key(0), "1")
    threading.Timer(0.2, saver.stdin.close).start()  # it saved, and exits
    agent._await_survivors(group)
    assert saver.pid in agent.exits.times, "armed: until the worker exited"
    assert time.monotonic() - started < 60, "not the whole grace"
    assert saver.wait(30) == 0
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        group.workers = [Worker(stuck.pid)]  # type: ignore[attr-defined]
        agent.exits.watch([stuck.pid])
        monkeypatch.setenv(survivor.GRACE_ENV, "0.3")
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="kubetrain.agent"):
            agent._await_survivors(group)
        # The agent's own verdict, not a clock: the grace ran out with the worker still running.
        assert stuck.poll() is None and "killing them" in caplog.text, "a worker that does not exit waits the grace"
        assert time.monotonic() - started < 60, "no more than the grace"
    finally:
        stuck.kill()
        stuck.wait()
