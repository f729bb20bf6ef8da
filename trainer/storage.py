"""The seam between the Checkpointer and where its checkpoints live.

Two storages sit behind it: a volume (kubetrain.trainer.volume: `step-N/` folders that a rename
makes atomic) and an object store (kubetrain.trainer.objectstore_storage: the folder staged on the
local disk, uploaded and committed to a log that fences stale attempts). The Checkpointer packs a
checkpoint (payload and meta), decides when to save and what a resume may accept; a storage
publishes a save, keeps the newest few, and reads back the one to resume.

A storage refuses by raising CheckpointError: a checkpoint it cannot read, a store that failed, a
commit the store refused to this attempt (objectstore.CommitRefused: a newer attempt holds the
store, and this one must stop). An error whose `reason` is set (objectstore.Unrecoverable) carries
api.contract's unrecoverable mark: no restart cures it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


def whole(value: Any) -> int:
    """An int field of a record or a store's note (a step, an epoch); 0 for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class CheckpointError(RuntimeError):
    """A checkpoint cannot be resumed (another configuration, world size or format), or its store
    failed or refused it (kubetrain.trainer.objectstore.StoreError)."""


@dataclass(frozen=True)
class Packed:
    """One checkpoint as the Checkpointer packed it: the step it holds, the payload (the training
    state and every rank's RNG state) and the meta a resume checks (fingerprint, world size, reason)."""

    step: int
    payload: dict[str, Any]
    meta: dict[str, Any]


class CheckpointStorage(Protocol):
    """Where rank 0 saves and resumes (a survivor saves through it too: `save_alone`). `where` is a
    Path on a volume, the object store's URL otherwise."""

    @property
    def location(self) -> str:
        """Where the checkpoints go, for messages: the directory, or the object store's URL."""
        ...

    def read_newest(self) -> tuple[Path | str, dict[str, Any], dict[str, Any]] | None:
        """Rank 0: (where, payload, meta) of the newest checkpoint it can read, or None when there
        is none. A store walks back past a commit whose payload is gone or damaged."""
        ...

    def save(self, packed: Packed, *, committed: Callable[[str], None], may_skip: bool) -> Path | str | None:
        """Rank 0: stage `step-<step>/`, commit it, and keep the newest few; `committed(where)` runs
        once it counts (before this returns, or later on a thread of the storage's). Returns where it
        goes; None when `may_skip` and the storage skipped it (a store stuck on the previous one)."""
        ...

    def save_alone(self, packed: Packed, *, writer: str, committed: Callable[[str], None]) -> str:
        """A survivor's save, committed before it returns; other survivors (each its own `writer`)
        may save the same step at the same time, and one copy is kept. `committed(where)` runs once
        the step is committed, by this writer or another, unless a newer step was committed first.
        Returns where the step is."""
        ...

    def wait(self, timeout: float | None = None) -> None:
        """Until the last save is committed, or `timeout` s passed; raises CheckpointError if it was
        not, and always when the store refused it."""
        ...
