"""An elastic gang's side of the torchrun agent (runtime/agent/inplace.py), without torchrun: the members
of each attempt from the operator's signed orders, the members file and the relay through the
store; a node on standby until an attempt names it; and its rank and size in the attempt's
rendezvous."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.stores import Store

from kubetrain.api.contract import ATTEMPT_ENV, format_members, order_signature, parse_members
from kubetrain.runtime.agent import inplace
from kubetrain.runtime.agent.inplace import InPlace

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def pod_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod's rendezvous variables (node 2 of 3), which a join rewrites: restored after each test."""
    for name in ("NODE_RANK", "PET_NODE_RANK", "NNODES", "PET_NNODES"):
        monkeypatch.setenv(name, "2" if "RANK" in name else "3")


def _agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node: int, attempt: int, members: list[int]) -> InPlace:
    pod = tmp_path / f"node-{node}"
    pod.mkdir()
    (pod / "members").write_text(format_members(attempt, members))
    (pod / "attempt").write_text(str(attempt))
    monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(pod / "attempt"))
    return InPlace()


def _rendezvous(node: int) -> SimpleNamespace:
    """What the agent sets on torch's StaticTCPRendezvous (torch_private.RESIZE's names)."""
    return SimpleNamespace(rank=node, world_size=3, run_id="job")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("4:0,2", (4, [0, 2])), ("0:", (0, [])), ("", None), ("4", None), ("x:0", None), ("4:0,a", None)],
)
def test_the_members_text(text: str, parsed: tuple[int, list[int]] | None) -> None:
    assert parse_members(text) == parsed
    if parsed is not None:
        assert parse_members(format_members(*parsed)) == parsed


def test_an_order_signs_its_members_too() -> None:
    assert order_signature("t", 3, [0, 1]) != order_signature("t", 3, [0, 1, 2]) != order_signature("t", 3)


def test_a_member_meets_the_attempts_gang_at_its_rank_in_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = _agent(tmp_path, monkeypatch, 2, 4, [0, 2])
    rendezvous = _rendezvous(2)
    one.join(rendezvous)
    assert (rendezvous.rank, rendezvous.world_size, rendezvous.run_id) == (1, 2, "job-attempt-4")
    assert one.node == 2, "its node rank stays what its pod is"
    # What its workers inherit: the gang's place and size, not the pod's place in the range.
    assert [os.environ[name] for name in ("NODE_RANK", "PET_NODE_RANK", "NNODES", "PET_NNODES")] == ["1", "1", "2", "2"]


def test_a_gang_of_a_fixed_size_is_left_as_torchrun_made_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "attempt").write_text("2")
    monkeypatch.setenv("KUBETRAIN_ATTEMPT_FILE", str(tmp_path / "attempt"))
    rendezvous = _rendezvous(1)
    InPlace().join(rendezvous)
    assert (rendezvous.rank, rendezvous.world_size, rendezvous.run_id) == (1, 3, "job")


@pytest.mark.timeout(60)
def test_a_node_outside_the_gang_waits_on_standby_until_an_attempt_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _agent(tmp_path, monkeypatch, 1, 2, [0, 2])
    rendezvous = _rendezvous(1)
    joined = threading.Thread(target=one.join, args=(rendezvous,))
    joined.start()
    deadline = time.monotonic() + 30
    while not one.port.ready and time.monotonic() < deadline:
        time.sleep(0.01)
    assert one.port.ready and joined.is_alive(), "on standby: Ready, and not in the rendezvous"
    standby = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"standby"' in line]
    assert [(r["attempt"], r["node"]) for r in standby] == [(2, 1)]
    # The operator grows the gang: the members first, then the attempt (as the kubelet writes both at once).
    (tmp_path / "node-1" / "members").write_text(format_members(3, [0, 1, 2]))
    (tmp_path / "node-1" / "attempt").write_text("3")
    joined.join(timeout=30)
    assert not joined.is_alive() and not one.port.ready
    assert (one.attempt, rendezvous.rank, rendezvous.world_size) == (3, 1, 3)


@pytest.mark.timeout(60)
def test_a_node_on_standby_preloads_its_workers_modules_before_it_turns_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that joins a gang later imports its workers' modules while it waits, not while the
    gang waits for it (the grow's stall): once, before it is Ready."""
    one = _agent(tmp_path, monkeypatch, 1, 2, [0, 2])
    one.group = SimpleNamespace(spec=SimpleNamespace(entrypoint="python3", args=("-m", "kubetrain.trainer")))
    preloads: list[tuple[list[str], bool]] = []
    monkeypatch.setattr(inplace.warmstart, "preload", lambda args: preloads.append((args, one.port.ready)) or 0.0)
    joined = threading.Thread(target=one.join, args=(_rendezvous(1),), daemon=True)
    joined.start()
    deadline = time.monotonic() + 30
    while not one.port.ready and time.monotonic() < deadline:
        time.sleep(0.01)
    assert preloads == [(["python3", "-m", "kubetrain.trainer"], False)]
    (tmp_path / "node-1" / "members").write_text(format_members(3, [0, 1, 2]))
    (tmp_path / "node-1" / "attempt").write_text("3")
    joined.join(timeout=30)
    monkeypatch.setattr(inplace.torch_private, "set_remaining_restarts", lambda *args: None)
    monkeypatch.setenv(ATTEMPT_ENV, "3")  # before_start sets it: restored after the test, not leaked
    one.before_start(SimpleNamespace(), SimpleNamespace(spec=SimpleNamespace(max_restarts=3, **vars(one.group.spec))))
    assert len(preloads) == 1, "not again at the first start"


def test_an_attempt_without_its_members_is_not_taken_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attempt file names attempt 5, but the members file still holds attempt 4's: an elastic
    agent waits for the members that come with it rather than meet a gang of the wrong size."""
    one = _agent(tmp_path, monkeypatch, 0, 4, [0, 1])
    (tmp_path / "node-0" / "attempt").write_text("5")
    assert one._ordered(Store()) is None
    (tmp_path / "node-0" / "members").write_text(format_members(5, [0, 1, 2]))
    assert one._ordered(Store()) == 5


def test_the_relay_carries_the_members(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _agent(tmp_path, monkeypatch, 0, 4, [0, 1, 2])
    late = _agent(tmp_path, monkeypatch, 1, 4, [0, 1, 2])
    store = Store()
    (tmp_path / "node-0" / "members").write_text(format_members(5, [0, 1]))
    (tmp_path / "node-0" / "attempt").write_text("5")
    assert first._ordered(store) == 5
    assert late._ordered(store) == 5 and late.membership(5) == [0, 1], "learnt from node 0's agent"


def test_a_signed_order_with_members_is_taken_and_a_tampered_one_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = inplace.AgentPort(None, "", "s3cret")
    good = {"attempt": 3, "members": [0, 2], "signature": order_signature("s3cret", 3, [0, 2])}
    assert port.order(json.dumps(good).encode())[0] == 202
    assert (port.ordered, port.members) == (3, {3: [0, 2]})
    forged = {**good, "attempt": 4, "members": [0, 1, 2]}
    assert port.order(json.dumps(forged).encode())[0] == 403 and port.ordered == 3


def test_the_order_body_reaches_the_agent_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """operator/agent_io.py's body, as the agent port reads it over HTTP."""
    import asyncio
    import socket

    from kubetrain.operator import agent_io

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    port = inplace.AgentPort(free, "127.0.0.1", "s3cret")
    port.open()
    try:
        assert port.server is not None
        outcome = asyncio.run(agent_io.order([("pod", "127.0.0.1")], free, "s3cret", 7, [0, 1]))
        assert outcome == {"pod": "ordered"} and port.members == {7: [0, 1]} and port.ordered == 7
    finally:
        assert port.server is not None
        port.server.shutdown()
        port.server.server_close()


@pytest.mark.timeout(60)
def test_node_0_abandons_an_attempt_whose_member_was_lost_and_the_others_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 5's gang is nodes 0, 1 and 2, but node 2 was lost before it came: nodes 0 and 1 do
    not sit in torch's rendezvous for it. They wait in node 0's store; node 0 hears attempt 6
    (nodes 0 and 1) and abandons 5; node 1 follows, even though its own order came later; both
    meet attempt 6's gang."""
    store = Store()
    agents = [_agent(tmp_path, monkeypatch, node, 5, [0, 1, 2]) for node in (0, 1)]
    rendezvous = [_rendezvous(0), _rendezvous(1)]
    for one in rendezvous:
        one._store = store  # connected (torch_private.RENDEZVOUS_STORE)
    threads = [threading.Thread(target=a.join, args=(r,)) for a, r in zip(agents, rendezvous, strict=True)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    assert all(thread.is_alive() for thread in threads), "node 2 never came: both wait, in Python"
    (tmp_path / "node-0" / "members").write_text(format_members(6, [0, 1]))
    (tmp_path / "node-0" / "attempt").write_text("6")
    time.sleep(0.3)
    assert all(thread.is_alive() for thread in threads), "node 1 has no order for attempt 6 yet"
    assert store.check(["kubetrain/gang/join/job/5/abandoned"])
    (tmp_path / "node-1" / "members").write_text(format_members(6, [0, 1]))
    (tmp_path / "node-1" / "attempt").write_text("6")
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert [(a.attempt, r.rank, r.world_size, r.run_id) for a, r in zip(agents, rendezvous, strict=True)] == [
        (6, 0, 2, "job-attempt-6"),
        (6, 1, 2, "job-attempt-6"),
    ]
