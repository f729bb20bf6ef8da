"""A script's own `init_process_group()` (env://) in a gang that kubetrain restarted in place.

torchrun's workers find their process group's keys in the store torchrun's agent hosts, and
torch adds no per-attempt prefix there: it makes a new store for each of torchrun's own restarts.
kubetrain's in-place restart (kubetrain.runtime.agent.inplace) keeps the agent, and its store, across
attempts, so a restarted worker would meet the keys of the attempt before it (the ranks'
addresses of processes that are gone) and hang in the rendezvous. The built-in trainer and
`kubetrain.trainer.lib` prefix their keys themselves (kubetrain.runtime.worker.dist); for every other
script the torchrun hooks hand such a call a client of the agent's store under a prefix of its
attempt (torchrun's restart count, which the agent sets to the attempt; the prefix and the count:
kubetrain.runtime.store). Only where that is needed: a restarted attempt (count > 0), the agent's
store, an env:// call with no store.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from kubetrain.runtime.store import restart_count, script_prefix


def needs_prefix(args: tuple[Any, ...], kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return (
        env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        and restart_count(env) > 0
        and len(args) <= 1  # init_process_group(backend) — no positional init_method
        and kwargs.get("init_method") in (None, "env://")
        and kwargs.get("store") is None
        and all(env.get(name) for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"))
    )


def prefixed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's keyword arguments with the attempt's store (torch's env:// handler's client
    of the agent's store, prefixed), rank and world size."""
    from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]
    from torch.distributed.constants import default_pg_timeout

    env = os.environ
    world_size = int(env["WORLD_SIZE"])
    store = TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=kwargs.get("timeout") or default_pg_timeout,
    )
    return {
        **{key: value for key, value in kwargs.items() if key != "init_method"},
        "store": PrefixStore(script_prefix(restart_count(env)), store),
        "rank": int(env["RANK"]),
        "world_size": world_size,
    }
