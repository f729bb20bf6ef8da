"""The gang store's wire: every key kubetrain keeps in the store torchrun's rendezvous gives, who
writes it and who reads it, and the attempt a process runs as. kubetrain.api.contract holds the env
contract; this module is its counterpart for the store, and the one place either is spelled
(tests/test_store_keys.py fails on a second).

The store is torch's TCPStore that node 0's torchrun agent hosts for its static rendezvous: the agents
reach it through their rendezvous, their workers at MASTER_ADDR:MASTER_PORT. It lives as long as node
0's agent, across kubetrain's in-place restarts (kubetrain.runtime.agent.inplace), so each attempt's
keys carry its number.

The agents' and the survivors' keys (the attempt: the agent's own, which it gives its workers as
ATTEMPT_ENV, `gang_attempt`):

    key                                        written by                      read by
    kubetrain/gang/<attempt>/failed            each agent whose workers        every agent, each monitor
      (a counter)                              failed (agent.inplace)          interval: a peer's failure
                                                                               stops its workers too
    kubetrain/gang/<attempt>/node/<group rank> that node's agent, once its     every agent: the gang's
      (JSON: what it saw)                      workers stopped                 first failure, reported once
    kubetrain/gang/<attempt>/registered        each agent, once its report     every agent, waiting for all
      (a counter)                              is in                           reports (bounded)
    kubetrain/gang/<attempt>/next              each agent that learns it       the agents holding the
      (the next attempt, and an elastic        itself (the operator's order,   stopped attempt, for one
      gang's members)                          its pod's attempt file)         reached late
    kubetrain/gang/<attempt>/survivor-save     rank 0's worker, once its       every agent after a failure:
      ("1")                                    trainer trained a step          its workers get the grace to
                                               (worker.survivor)               save before they are killed
    kubetrain/gang/<attempt>/survivor/<rank>   each worker that outlived a     the higher ranks among them:
      ("1")                                    peer (worker.survivor)          the lowest one saves

An elastic gang's gathering (agent.inplace; the run id: torch's rendezvous's, before any attempt's):

    kubetrain/gang/join/<run id>/<attempt>/<node>       each member of the attempt   its first member
    kubetrain/gang/join/<run id>/<attempt>/go           its first member, once all   the other members
                                                        came
    kubetrain/gang/join/<run id>/<attempt>/abandoned    its first member, when a     the other members: they
                                                        later attempt came first     go to that one

A worker's process group, under a prefix of torchrun's restart count (`restart_count`; the agent
sets it to the attempt), so that a restarted worker never meets the keys of the attempt before:

    kubetrain/attempt_<count>/...              the built-in trainer's and kubetrain.trainer.lib's
                                               workers (worker.dist): the contract check's
                                               `world_size` and `verdict` (rank 0), `check/<rank>`
                                               (the others), then torch's process-group keys
    kubetrain/script/attempt_<count>/...       a script's own init_process_group() in a restarted
                                               attempt (guest.attempt_store): torch's keys

torch's own key, which kubetrain only waits on: torchrun's exit barrier, whose name is made of torch's
private names (kubetrain.runtime.torch_private.exit_barrier_key). Every agent counts itself in under
it; node 0's agent (kubetrain.runtime.torchrun_hooks) and node 0's workers (worker.dist) wait for the
others there (`hold_exit_barrier`), the workers under the run's id (`run_key`).

Standard library and kubetrain.api.contract only: this runs beside any script, on Python 3.10 and later.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from kubetrain.api.contract import ATTEMPT_ENV

# torchrun's, set for every worker it starts.
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"

GANG = "kubetrain/gang"
JOIN = f"{GANG}/join"
ATTEMPT_PREFIX = "kubetrain/attempt_"
SCRIPT_PREFIX = "kubetrain/script/attempt_"

# The contract check's keys, under `trainer_prefix` (kubetrain.runtime.worker.dist).
WORLD_SIZE_KEY = "world_size"
VERDICT_KEY = "verdict"

EXIT_BARRIER_POLL_S = 0.05


# --- the attempt -----------------------------------------------------------------------------


def gang_attempt(environ: Mapping[str, str] | None = None) -> int | None:
    """The gang's attempt this process runs in: ATTEMPT_ENV, which the operator renders into every pod
    (its count of the gang's attempts, a recreated gang's included) and torchrun's in-place agent sets
    for the workers it starts to the attempt it starts them as. None where it is unset or not a count
    (a process outside a kubetrain job). Records and checkpoint commits carry it."""
    raw = (os.environ if environ is None else environ).get(ATTEMPT_ENV, "")
    return int(raw) if raw.isdigit() else None


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """torchrun's count of its restarts of this pod's workers (RESTART_COUNT_ENV, which it gives each
    worker), not the gang's attempt: under kubetrain's in-place agent it is the attempt (the agent sets
    torchrun's restarts left so that it is), elsewhere torchrun's own. 0 outside torchrun, or where it
    is not a count. A worker's process-group keys are kept apart by it."""
    raw = (os.environ if environ is None else environ).get(RESTART_COUNT_ENV, "")
    return int(raw) if raw.isdigit() else 0


# --- the agents' keys ------------------------------------------------------------------------


def _gang(attempt: int, *parts: object) -> str:
    return "/".join([GANG, str(attempt), *map(str, parts)])


def failed_key(attempt: int) -> str:
    return _gang(attempt, "failed")


def report_key(attempt: int, group_rank: int) -> str:
    return _gang(attempt, "node", group_rank)


def registered_key(attempt: int) -> str:
    return _gang(attempt, "registered")


def next_attempt_key(attempt: int) -> str:
    return _gang(attempt, "next")


def armed_key(attempt: int) -> str:
    return _gang(attempt, "survivor-save")


def survivor_key(attempt: int, rank: int) -> str:
    return _gang(attempt, "survivor", rank)


def joined_key(run_id: str, attempt: int, node: int) -> str:
    return f"{JOIN}/{run_id}/{attempt}/{node}"


def go_key(run_id: str, attempt: int) -> str:
    return f"{JOIN}/{run_id}/{attempt}/go"


def abandoned_key(run_id: str, attempt: int) -> str:
    return f"{JOIN}/{run_id}/{attempt}/abandoned"


# --- the workers' prefixes -------------------------------------------------------------------


def trainer_prefix(restarts: int) -> str:
    return f"{ATTEMPT_PREFIX}{restarts}"


def check_key(rank: int) -> str:
    return f"check/{rank}"


def script_prefix(restarts: int) -> str:
    return f"{SCRIPT_PREFIX}{restarts}"


# --- torchrun's exit barrier -----------------------------------------------------------------


def run_key(run_id: str, key: str) -> str:
    """`key` as a client of the unprefixed store names it: torchrun's agents keep theirs on
    PrefixStore(run id)."""
    return f"{run_id}/{key}"


def hold_exit_barrier(
    store: Any, group_rank: int, world: int, key: str, timeout_s: float, interval_s: float = EXIT_BARRIER_POLL_S
) -> bool:
    """The one hold of node 0 at torchrun's exit barrier, from its agent (kubetrain.runtime.torchrun_hooks)
    or from one of its workers (kubetrain.runtime.worker.dist): on node 0 of several, return once the
    `world - 1` other agents counted themselves in under `key` (True), or after `timeout_s` (False).
    True at once on any other node, or with no other node."""
    if group_rank != 0 or world < 2:
        return True
    deadline = time.monotonic() + timeout_s
    while store.add(key, 0) < world - 1:
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True
