"""The Checkpointer: collective save/load of a training state; only rank 0 does the I/O.

On resume rank 0 reads the newest checkpoint it can use and broadcasts it; each rank gets its own
RNG states scattered back. So only node 0 needs the checkpoints, and NFS attribute caching on other
nodes cannot make a rank see an older checkpoint than rank 0.

Where the checkpoints live is one CheckpointStorage (kubetrain.trainer.storage): `step-N/` folders
on a volume (kubetrain.trainer.volume), or with `object_store` (checkpoint.objectStore) commits to
an object store, uploaded in the background (kubetrain.trainer.objectstore_storage). A save that
must count before the process goes on (a stop's, the final one) waits for its commit; a stop's at
most its grace period less STOP_MARGIN_S.

The volume's reading functions (latest_checkpoint, complete_checkpoints, read_checkpoint) and
CheckpointError are importable from here, as users' scripts and tools always did.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kubetrain.api.contract import DEFAULT_GRACE_SECONDS, SHUTDOWN_TIMEOUT_ENV, unrecoverable
from kubetrain.api.training import ObjectStoreConfig
from kubetrain.runtime.worker.metrics import MetricsLogger
from kubetrain.trainer.objectstore_storage import ObjectStoreStorage
from kubetrain.trainer.storage import CheckpointError, CheckpointStorage, Packed, whole
from kubetrain.trainer.volume import VolumeStorage, complete_checkpoints, latest_checkpoint, read_checkpoint

__all__ = [
    "STOP_MARGIN_S",
    "CheckpointError",
    "Checkpointer",
    "complete_checkpoints",
    "latest_checkpoint",
    "read_checkpoint",
    "rng_state",
    "set_rng_state",
    "stop_bound",
]

# What a stop's save leaves of the pods' grace period (PET_SHUTDOWN_TIMEOUT) for the barrier and the
# exit after its commit: a store that does not commit in time leaves the last commit standing.
STOP_MARGIN_S = 15.0


def rng_state(generators: list[torch.Generator] | None = None) -> dict[str, Any]:
    """This process's RNG states: torch CPU and CUDA, Python's, and any extra generators."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "generators": [g.get_state() for g in generators or []],
    }


def set_rng_state(state: dict[str, Any] | None, generators: list[torch.Generator] | None = None) -> None:
    """Restore what `rng_state` took; None (a rank the checkpoint has no state of) keeps the current."""
    if state is None:
        return
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(_as_tuple(state["python"]))
    for generator, saved in zip(generators or [], state["generators"], strict=True):
        generator.set_state(saved)


def _as_tuple(value: Any) -> Any:
    # Python's RNG state is a nested tuple; pickling through broadcast keeps it, but be strict.
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value


class Checkpointer:
    """Collective save/load of a training state, and when the next save is due.

    Every rank calls `save` and `load` together. `state` is whatever the caller wants back
    (state_dicts, counters); it must be the same on every rank (as DDP keeps it), so only
    rank 0's copy is written. Per-rank RNG states and the loaders' generators are gathered
    to rank 0 and restored per rank on load.

    With `every_steps` / `every_seconds`, `due` says whether a step should be saved. Clocks
    differ between ranks, so the time rule is rank 0's alone: the caller sends rank 0's
    `time_vote()` to every rank (the built-in loop packs it into the collective it already
    makes on log steps) and passes the agreed vote to `due`.

    With `resizable` a checkpoint written by another number of processes is resumed too (the
    state must say where the run is in a way that holds at any size: kubetrain.trainer.cursor);
    the ranks it had no RNG state of keep their own. Without it such a resume is refused.

    `save_alone` is the save of a rank whose peers are gone (kubetrain.runtime.worker.survivor): no
    collective, and only its own RNG state.

    With `object_store` the checkpoints are committed to it (the module docstring); `job` and
    `attempt` (default: KUBETRAIN_JOB_UID and KUBETRAIN_ATTEMPT) fence a stale attempt's commits.
    With `metrics`, rank 0 logs a `checkpoint` record once a checkpoint is committed (an
    object-store save: when its upload lands) and a `checkpoint_refused` record for each stale
    commit the store refused; without it the caller logs its own.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        rank: int,
        world_size: int,
        keep: int = 3,
        fingerprint: str | None = None,
        generators: list[torch.Generator] | None = None,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        object_store: ObjectStoreConfig | str | None = None,
        metrics: MetricsLogger | None = None,
        job: str | None = None,
        attempt: int | None = None,
        resizable: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.resizable = resizable
        self.rank = rank
        self.world_size = world_size
        self.keep = keep
        self.fingerprint = fingerprint
        self.generators = list(generators or [])
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.metrics = metrics
        # The newest step on disk (None before the first save or resume), and when it was written.
        self.last_step: int | None = None
        # Why the checkpoint `load` resumed was taken (its meta.json; rank 0 only).
        self.loaded_reason: str | None = None
        self._last_time = time.monotonic()
        if isinstance(object_store, str):
            object_store = ObjectStoreConfig(url=object_store)
        self.storage: CheckpointStorage = (
            VolumeStorage(self.directory, keep)
            if object_store is None
            else ObjectStoreStorage(
                self.directory, object_store, rank=rank, keep=keep, job=job, attempt=attempt, metrics=metrics
            )
        )
        self.skipped_saves = 0  # periodic saves not taken while an upload was stuck

    @property
    def location(self) -> str:
        """Where the checkpoints go: the directory, or the object store's URL."""
        return self.storage.location

    def time_vote(self) -> bool:
        """Rank 0's opinion that `every_seconds` have passed since the last save; False elsewhere."""
        if self.rank != 0 or self.every_seconds is None:
            return False
        return time.monotonic() - self._last_time >= self.every_seconds

    def due(self, step: int, *, time_vote: bool = False) -> bool:
        """Whether `step` should be saved: on the `every_steps` cadence, or by the agreed time vote."""
        if step == self.last_step:
            return False
        return (self.every_steps is not None and step % self.every_steps == 0) or time_vote

    def save(
        self,
        step: int,
        state: dict[str, Any],
        *,
        reason: str | None = None,
        epoch: int | None = None,
        wait: bool | None = None,
    ) -> Path | str | None:
        """Write `step-<step>/` on rank 0; returns where it goes there (a Path, or the object
        store's URL of it), None elsewhere. `reason` (why it was taken: periodic, epoch, final,
        signal) is kept in its meta. An object-store save returns once staged, its upload goes
        on in the background; with `wait` (the default for reason "signal" or "final": the process
        may exit right after) it returns only once committed (a "signal" save within its grace).
        Returns None, saving nothing, when a periodic save finds the previous upload stuck."""
        mine = rng_state(self.generators)
        ranks: list[Any] = [mine]
        if self.world_size > 1:
            ranks = [None] * self.world_size if self.rank == 0 else []
            dist.gather_object(mine, ranks if self.rank == 0 else None, dst=0)
        # Only once the gather went through: a peer lost during it leaves the step unsaved, and
        # the survivor's save (kubetrain.runtime.worker.survivor) must not take it for saved.
        saved_before = self.last_step
        self.last_step, self._last_time = step, time.monotonic()
        if self.rank != 0:
            return None
        payload, meta, epoch = self._package(state, ranks, reason, epoch)
        must_commit = bool(wait or (wait is None and reason in ("signal", "final")))
        committed = self._committed(step, epoch, reason)
        where = self.storage.save(Packed(step, payload, meta), committed=committed, may_skip=not must_commit)
        if where is None:
            self.skipped_saves += 1
            self.last_step = saved_before  # not saved: rank 0's survivor save may still take it
            return None
        if must_commit:
            self.wait(timeout=stop_bound() if reason == "signal" else None)
        return where

    def _package(
        self, state: dict[str, Any], ranks: list[Any], reason: str | None, epoch: int | None
    ) -> tuple[dict[str, Any], dict[str, Any], int]:
        """(payload, meta, epoch) of a checkpoint of `state` with the ranks' RNG states `ranks`."""
        meta = {"fingerprint": self.fingerprint, "world_size": self.world_size, "reason": reason}
        return {"state": state, "ranks": ranks}, meta, epoch if epoch is not None else whole(state.get("epoch"))

    def _committed(self, step: int, epoch: int, reason: str | None) -> Callable[[str], None]:
        """What runs once the checkpoint of `step` counts (an object store's: on its upload's thread)."""

        def committed(where: str) -> None:
            self._record("checkpoint", step=step, epoch=epoch, path=where, reason=reason)

        return committed

    def save_alone(self, step: int, state: dict[str, Any], *, reason: str, epoch: int | None = None) -> str:
        """Save `state` from this rank alone, committed before it returns; its peers are gone, so no
        collective runs and the other ranks' RNG states are absent (None). Other survivors may save
        the same step at the same time: one copy is kept. Returns where it went."""
        ranks: list[Any] = [None] * self.world_size
        ranks[self.rank] = rng_state(self.generators)
        payload, meta, epoch = self._package(state, ranks, reason, epoch)
        self.last_step = step
        committed = self._committed(step, epoch, reason)
        return self.storage.save_alone(Packed(step, payload, meta), writer=f"-rank{self.rank}", committed=committed)

    def wait(self, timeout: float | None = None) -> None:
        """Rank 0: until the last save is committed (a no-op on a volume and on other ranks), or
        `timeout` s passed. Raises CheckpointError if it was not."""
        self.storage.wait(timeout=timeout)

    def _record(self, event: str, **fields: Any) -> None:
        if self.metrics is not None:
            self.metrics.emit(event, **fields)

    def _check(self, path: Path | str, meta: dict[str, Any]) -> str | None:
        """Why the checkpoint at `path` cannot be resumed by this run (no restart changes that: the
        text carries the unrecoverable mark), or None."""
        if self.fingerprint is not None and meta.get("fingerprint") != self.fingerprint:
            return unrecoverable(
                "CheckpointIncompatible",
                f"refusing to resume {path}: it was written by a different training configuration "
                f"(fingerprint {meta.get('fingerprint')}, this run {self.fingerprint}); use a new "
                "checkpoint dir or restore the original training settings",
            )
        if meta.get("world_size") != self.world_size and not self.resizable:
            return unrecoverable(
                "CheckpointIncompatible",
                f"refusing to resume {path}: it was written by {meta.get('world_size')} processes and this "
                f"run has {self.world_size}; the data order and RNG streams would not continue (the built-in "
                "trainer resumes at any size when training.globalBatchSize is set)",
            )
        return None

    def load(self) -> tuple[Path | str, dict[str, Any]] | None:
        """Rank 0 reads the newest complete checkpoint, every rank gets (where, state) and its RNG
        back: where is a Path on a volume, the object store's URL of it otherwise."""
        header: list[Any] = [None, None, None]  # error, where, step: what every rank learns
        payload: dict[str, Any] | None = None
        if self.rank == 0:
            try:
                newest = self.storage.read_newest()
                if newest is not None:
                    where, payload, meta = newest
                    header = [self._check(where, meta), where, meta.get("step")]
                    self.loaded_reason = meta.get("reason")
            except Exception as exc:  # an unreadable newest checkpoint must stop every rank
                header = [
                    f"cannot load the newest checkpoint of {self.location}: {type(exc).__name__}: {exc}",
                    None,
                    None,
                ]
                if getattr(exc, "reason", None) is not None:  # objectstore.Unrecoverable: its one sentence
                    header[0] = str(exc)
        if self.world_size > 1:
            dist.broadcast_object_list(header, src=0)
        error, where, step = header
        if error is not None:
            raise CheckpointError(error)
        if where is None:
            return None
        ranks = payload["ranks"] if payload is not None else None
        if ranks is not None and len(ranks) != self.world_size:  # resizable: resumed at another size
            ranks = (list(ranks) + [None] * self.world_size)[: self.world_size]
        state: list[Any] = [payload["state"] if payload is not None else None]
        mine: list[Any] = [ranks[0] if ranks else None]
        if self.world_size > 1:
            dist.broadcast_object_list(state, src=0)
            dist.scatter_object_list(mine, ranks, src=0)
        set_rng_state(mine[0], self.generators)
        restored: dict[str, Any] = state[0]
        self.last_step, self._last_time = step, time.monotonic()
        return where, restored


def stop_bound() -> float:
    """How long a stop's save may wait for its commit: the grace period less STOP_MARGIN_S."""
    raw = os.environ.get(SHUTDOWN_TIMEOUT_ENV, "")
    grace = float(raw) if raw.replace(".", "", 1).isdigit() else float(DEFAULT_GRACE_SECONDS)
    return max(grace - STOP_MARGIN_S, 1.0)
