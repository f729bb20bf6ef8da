"""kubetrain.runtime.guest.attempt_store: a script's env:// init_process_group in an attempt restarted
in place gets the agent's store under its attempt's prefix (end to end: the plain script of
tests/local/test_hang_forensics.py, restarted in place after its stall)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from kubetrain.runtime.guest import attempt_store

pytestmark = pytest.mark.unit

RESTARTED = {
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "RANK": "1",
    "WORLD_SIZE": "2",
}


@pytest.mark.parametrize(
    ("args", "kwargs", "change", "needed"),
    [
        (("gloo",), {}, {}, True),
        ((), {"backend": "gloo", "init_method": "env://", "timeout": timedelta(seconds=5)}, {}, True),
        (("gloo",), {}, {"TORCHELASTIC_RESTART_COUNT": "0"}, False),  # torch's own store is fresh
        (("gloo",), {}, {"TORCHELASTIC_USE_AGENT_STORE": "False"}, False),  # not the agent's store
        (("gloo", "tcp://10.0.0.1:23456"), {}, {}, False),  # the script names its own rendezvous
        (("gloo",), {"init_method": "file:///tmp/x"}, {}, False),
        (("gloo",), {"store": object()}, {}, False),  # kubetrain.runtime.worker.dist, or a script's store
        (("gloo",), {}, {"MASTER_PORT": ""}, False),
    ],
)
def test_only_a_scripts_env_init_in_a_restarted_attempt_is_prefixed(
    args: tuple[Any, ...], kwargs: dict[str, Any], change: dict[str, str], needed: bool
) -> None:
    assert attempt_store.needs_prefix(args, kwargs, {**RESTARTED, **change}) is needed


def test_the_attempt_gets_the_agents_store_under_its_own_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    server = TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    env = {**RESTARTED, "MASTER_PORT": str(server.port)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    server.set("rank_0_address", b"gone")  # a key the attempt before left behind
    kwargs = attempt_store.prefixed({"backend": "gloo", "init_method": "env://", "timeout": timedelta(seconds=10)})
    assert (kwargs["backend"], kwargs["rank"], kwargs["world_size"], "init_method" in kwargs) == ("gloo", 1, 2, False)
    store = kwargs["store"]
    assert not store.check(["rank_0_address"]), "the earlier attempt's keys are out of sight"
    store.set("rank_0_address", b"new")
    assert server.get("kubetrain/script/attempt_2/rank_0_address") == b"new"
