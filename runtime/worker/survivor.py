"""No step lost when a peer dies: the lowest surviving rank saves the last completed step.

Under DDP every rank holds the whole training state, the same on each, at every step boundary.
When a peer process dies, the survivors' next collective fails (gloo: "Connection closed by
peer"); at that moment their state is still the last completed step: a failed gradient
all-reduce comes before the optimizer step, and every other collective of the loop sits between
steps. So one survivor can save that step, alone, before the gang restarts, and the restart
resumes where the gang was instead of at the last periodic save.

Which survivor: each one registers in the rendezvous store (node 0's torchrun agent holds it; the
workers reach it at MASTER_ADDR:MASTER_PORT); rank 0 saves at once, any other rank waits SETTLE_S
for a lower one to learn of the loss too, and saves unless one registered. A lower survivor may
learn of it only later: gloo's ring can hold it in a collective with a live peer until that
peer exits. It then finds the step saved. Without a store (node 0's pod is the one gone) every
survivor saves. Writes of one step keep one copy (kubetrain.trainer.checkpoint).

KUBETRAIN_SURVIVOR=off in a worker's environment (the container's command or image: a job's `env`
may not set KUBETRAIN_* names) turns it off: the workers are then killed at once, as before.

A trainer that can save this way `arm`s it once it trained a step: it marks the attempt in the
store, and the agents then give their workers up to `grace_s()` to save and exit on their own
before they kill them (kubetrain.runtime.agent.inplace). Workers of scripts that never arm it are
killed at once, as before. Standard library and torch only: this runs beside any script.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from typing import Any

from kubetrain.runtime.store import armed_key, gang_attempt, restart_count, survivor_key

log = logging.getLogger("kubetrain.survivor")

# How a worker's error reads when a peer process died under it (gloo, NCCL): the consequence of
# another failure. The agent blames it only when no other worker failed.
PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote process exited",
    "ncclRemoteError",
)
SETTLE_S = 0.2
CONNECT_S = 2.0
ENABLED_ENV = "KUBETRAIN_SURVIVOR"
GRACE_ENV = "KUBETRAIN_SURVIVOR_GRACE_SECONDS"
# How long an agent waits for its workers to save and exit after a gang failure, once armed: a
# survivor notices the loss at its next collective (milliseconds with gloo), then writes one
# checkpoint. A worker still running after this is killed, its save lost (the last one stands).
DEFAULT_GRACE_S = 30.0


def peer_lost(text: str) -> bool:
    """Whether an error's text says a peer process went away under it."""
    return any(sign in text for sign in PEER_LOST)


def peer_lost_error(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, says a peer went away."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return False
        if peer_lost(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def grace_s() -> float:
    raw = os.environ.get(GRACE_ENV, "")
    try:
        return max(float(raw), 0.0) if raw else DEFAULT_GRACE_S
    except ValueError:
        return DEFAULT_GRACE_S


def attempt() -> int:
    """The attempt this worker's keys belong to: the gang's, which its agent reads them under (the
    agent gives it to its workers), else torchrun's restart count."""
    gang = gang_attempt()
    return restart_count() if gang is None else gang


class Survivor:
    """A worker's side: `arm()` after its first step, `elected()` when a collective failed."""

    def __init__(self, rank: int, store: Any = None) -> None:
        """`store`: the agent's store when the caller holds a client of it already (DistContext)."""
        self.rank = rank
        self.attempt = attempt()
        self._store: Any = store
        self.enabled = os.environ.get(ENABLED_ENV, "").strip().lower() not in ("off", "0", "false", "no")
        self.armed = not self.enabled  # off: never armed, so the agents kill at once

    def _connect(self) -> Any:
        if self._store is None:
            from torch.distributed import TCPStore  # type: ignore[attr-defined]

            host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
            if not host or not port.isdigit():
                return None
            self._store = TCPStore(
                host, int(port), is_master=False, timeout=timedelta(seconds=CONNECT_S), wait_for_workers=False
            )
        return self._store

    def arm(self) -> None:
        """Tell the agents this attempt's workers save when a peer dies (once; rank 0 writes it)."""
        if self.armed:
            return
        self.armed = True
        if self.rank != 0:
            return
        try:
            store = self._connect()
            if store is not None:
                store.set(armed_key(self.attempt), "1")
        except Exception as exc:  # no store: the agents kill at once, as without this
            log.warning("could not arm the survivor's save: %s", exc)

    def elected(self) -> bool:
        """Whether this rank saves: rank 0, or no lower rank registered as a survivor within
        SETTLE_S (True without a store)."""
        try:
            store = self._connect()
            if store is None:
                return True
            store.set(survivor_key(self.attempt, self.rank), "1")
            if self.rank == 0:
                return True
            time.sleep(SETTLE_S)
            lower = [survivor_key(self.attempt, rank) for rank in range(self.rank)]
            return not any(store.check([name]) for name in lower)
        except Exception as exc:
            log.warning("rendezvous store unreachable (%s): saving without an election", exc)
            return True

    def save(self, error: BaseException, checkpointer: Any, step: int, state: dict[str, Any]) -> bool:
        """From an `except` around the loop: when `error` says a peer died and this rank is
        elected, save `state` (the last completed step's, `step`) through `checkpointer` (a
        kubetrain.trainer.checkpoint.Checkpointer) alone. True once saved here."""
        if not self.enabled or not peer_lost_error(error) or checkpointer.last_step == step:
            return False
        if not self.elected():
            return False
        try:
            where = checkpointer.save_alone(step, state, reason="peer_lost")
        except Exception as exc:  # the error that ends this process is the peer's loss, not this
            log.error("a peer is gone and the save of step %d failed: %s", step, exc)
            return False
        log.warning("a peer is gone: step %d saved in %s", step, where)
        return True
