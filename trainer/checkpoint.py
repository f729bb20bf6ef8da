"""Atomic `step-N/` checkpoints; only rank 0 touches the directory.

Layout of `<dir>`:

    step-120/state.pt    torch.save of {"state": ..., "ranks": [per-rank RNG + loader state]}
    step-120/meta.json   written last; a step-N/ without it is incomplete and ignored
    metrics.jsonl        rank 0's metrics records (trainer/metrics.py)

A save writes `state.pt` into `.tmp-step-N-<pid>/`, fsyncs it, renames the folder to
`step-N/` (fsyncing the parent), then writes `meta.json` through its own temporary name and
rename. A kill at any point leaves the previous complete checkpoint as the newest one.

On resume rank 0 reads the newest complete checkpoint and broadcasts it; each rank gets its
own RNG states scattered back. So only node 0 needs the volume, and NFS attribute caching
on other nodes cannot make a rank see an older checkpoint than rank 0.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STATE_FILE = "state.pt"
META_FILE = "meta.json"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be resumed (another configuration, world size or format)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def step_of(path: Path) -> int:
    """N of a `step-N` checkpoint folder."""
    match = _STEP_DIR.match(path.name)
    if match is None:
        raise CheckpointError(f"{path} is not a step-N checkpoint folder")
    return int(match.group(1))


def complete_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for child in directory.iterdir():
        match = _STEP_DIR.match(child.name)
        if not match or not child.is_dir():
            continue
        meta = _read_meta(child)
        if meta is not None and meta.get("step") == int(match.group(1)) and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = complete_checkpoints(directory)
    return found[-1][1] if found else None


def write_checkpoint(directory: str | Path, step: int, payload: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write `step-<step>/` atomically (see the module docstring) and return its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f"{_TMP_PREFIX}step-{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    with (tmp / STATE_FILE).open("wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    final = directory / f"step-{step}"
    if final.exists():
        # Left by a run killed between the rename and meta.json (a complete one is never
        # rewritten: the loop saves each step at most once).
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(directory)
    meta_tmp = final / f"{_TMP_PREFIX}{META_FILE}"
    with meta_tmp.open("w", encoding="utf-8") as f:
        json.dump({**meta, "step": step, "format_version": FORMAT_VERSION, "time": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(meta_tmp, final / META_FILE)
    _fsync_dir(final)
    return final


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(payload, meta) of a complete checkpoint; tensors on the CPU."""
    path = Path(path)
    meta = _read_meta(path)
    if meta is None:
        raise CheckpointError(f"{path} has no readable {META_FILE}: it is not a complete checkpoint")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {meta.get('format_version')}, expected {FORMAT_VERSION}")
    payload = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    return payload, meta


def prune(directory: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints, and every incomplete leftover."""
    directory = Path(directory)
    complete = complete_checkpoints(directory)
    kept = {path for _, path in complete[-keep:]}
    removed = []
    for child in directory.iterdir():
        if not child.is_dir():
            continue
        stale = child.name.startswith(_TMP_PREFIX) or (_STEP_DIR.match(child.name) and child not in kept)
        if stale:
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed


def rng_state(generators: list[torch.Generator] | None = None) -> dict[str, Any]:
    """This process's RNG states: torch CPU and CUDA, Python's, and any extra generators."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "generators": [g.get_state() for g in generators or []],
    }


def set_rng_state(state: dict[str, Any], generators: list[torch.Generator] | None = None) -> None:
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
    ) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.world_size = world_size
        self.keep = keep
        self.fingerprint = fingerprint
        self.generators = list(generators or [])
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        # The newest step on disk (None before the first save or resume), and when it was written.
        self.last_step: int | None = None
        # Why the checkpoint `load` resumed was taken (its meta.json; rank 0 only).
        self.loaded_reason: str | None = None
        self._last_time = time.monotonic()

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

    def save(self, step: int, state: dict[str, Any], *, reason: str | None = None) -> Path | None:
        """Write `step-<step>/` on rank 0; returns its path there, None elsewhere. `reason`
        (why it was taken: periodic, epoch, final, signal) is kept in its meta.json."""
        self.last_step, self._last_time = step, time.monotonic()
        mine = rng_state(self.generators)
        ranks: list[Any] = [mine]
        if self.world_size > 1:
            ranks = [None] * self.world_size if self.rank == 0 else []
            dist.gather_object(mine, ranks if self.rank == 0 else None, dst=0)
        if self.rank != 0:
            return None
        meta = {"fingerprint": self.fingerprint, "world_size": self.world_size, "reason": reason}
        path = write_checkpoint(self.directory, step, {"state": state, "ranks": ranks}, meta)
        prune(self.directory, self.keep)
        return path

    def _check(self, path: Path, meta: dict[str, Any]) -> str | None:
        if self.fingerprint is not None and meta.get("fingerprint") != self.fingerprint:
            return (
                f"refusing to resume {path}: it was written by a different training configuration "
                f"(fingerprint {meta.get('fingerprint')}, this run {self.fingerprint}); use a new "
                "checkpoint dir or restore the original training settings"
            )
        if meta.get("world_size") != self.world_size:
            return (
                f"refusing to resume {path}: it was written by {meta.get('world_size')} processes and this "
                f"run has {self.world_size}; the data order and RNG streams would not continue"
            )
        return None

    def load(self) -> tuple[Path, dict[str, Any]] | None:
        """Rank 0 reads the newest complete checkpoint, every rank gets (path, state) and its RNG back."""
        message: list[Any] = [None, None, None]  # error, path, payload
        if self.rank == 0:
            path = latest_checkpoint(self.directory)
            if path is not None:
                try:
                    payload, meta = read_checkpoint(path)
                    message = [self._check(path, meta), str(path), payload]
                    self.loaded_reason = meta.get("reason")
                except Exception as exc:  # an unreadable newest checkpoint must stop every rank
                    message = [f"cannot load {path}: {type(exc).__name__}: {exc}", str(path), None]
        if self.world_size > 1:
            error_and_path = [message[0], message[1]]
            dist.broadcast_object_list(error_and_path, src=0)
            message[0], message[1] = error_and_path
        if message[0] is not None:
            raise CheckpointError(message[0])
        if message[1] is None:
            return None
        ranks = message[2]["ranks"] if self.rank == 0 else None
        state: list[Any] = [message[2]["state"] if self.rank == 0 else None]
        mine: list[Any] = [ranks[0] if ranks else None]
        if self.world_size > 1:
            dist.broadcast_object_list(state, src=0)
            dist.scatter_object_list(mine, ranks, src=0)
        set_rng_state(mine[0], self.generators)
        restored: dict[str, Any] = state[0]
        path = Path(message[1])
        self.last_step, self._last_time = step_of(path), time.monotonic()
        return path, restored
