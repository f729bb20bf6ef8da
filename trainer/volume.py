"""Checkpoints on a volume: atomic `step-N/` folders; only rank 0 touches the directory.

Layout of `<dir>`:

    step-120/state.pt    torch.save of {"state": ..., "ranks": [per-rank RNG + loader state]}
    step-120/meta.json   written last; a step-N/ without it is incomplete and ignored
    metrics.jsonl        rank 0's metrics records (runtime/worker/metrics.py)

A save writes `state.pt` into `.tmp-step-N-<pid>/`, fsyncs it, renames the folder to
`step-N/` (fsyncing the parent), then writes `meta.json` through its own temporary name and
rename. A kill at any point leaves the previous complete checkpoint as the newest one.

The object store stages its checkpoints in this format too, without fsync
(kubetrain.trainer.objectstore_storage).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kubetrain.trainer.storage import CheckpointError, Packed

STATE_FILE = "state.pt"
META_FILE = "meta.json"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-"


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


def write_checkpoint(
    directory: str | Path,
    step: int,
    payload: dict[str, Any],
    meta: dict[str, Any],
    *,
    durable: bool = True,
    writer: str = "",
) -> Path:
    """Write `step-<step>/` atomically (see the module docstring) and return its path. Without
    `durable` nothing is fsynced (a staged copy, made durable by its upload). With `writer` (a
    survivor's save, kubetrain.runtime.worker.survivor), other processes may write the same step at the
    same time: the first rename wins, and a `step-<step>/` already there is kept, not replaced."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step}"
    if writer and final.exists():
        return final
    tmp = directory / f"{_TMP_PREFIX}step-{step}-{os.getpid()}{writer}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    sync = os.fsync if durable else (lambda fd: None)
    with (tmp / STATE_FILE).open("wb") as f:
        torch.save(payload, f)
        f.flush()
        sync(f.fileno())
    if durable:
        _fsync_dir(tmp)
    if final.exists() and not writer:
        # Left by a run killed between the rename and meta.json (a complete one is never
        # rewritten: the loop saves each step at most once).
        shutil.rmtree(final)
    try:
        os.rename(tmp, final)
    except OSError:
        if not writer or not final.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another survivor's rename came first
        return final
    if durable:
        _fsync_dir(directory)
    meta_tmp = final / f"{_TMP_PREFIX}{META_FILE}"
    with meta_tmp.open("w", encoding="utf-8") as f:
        json.dump(full_meta(step, meta), f)
        f.flush()
        sync(f.fileno())
    os.rename(meta_tmp, final / META_FILE)
    if durable:
        _fsync_dir(final)
    return final


def full_meta(step: int, meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "step": step, "format_version": FORMAT_VERSION, "time": time.time()}


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(payload, meta) of a complete checkpoint; tensors on the CPU."""
    path = Path(path)
    meta = _read_meta(path)
    if meta is None:
        raise CheckpointError(f"{path} has no readable {META_FILE}: it is not a complete checkpoint")
    return read_state(path / STATE_FILE, meta, str(path)), meta


def read_state(state_file: Path, meta: dict[str, Any], where: str) -> dict[str, Any]:
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{where} has format version {meta.get('format_version')}, expected {FORMAT_VERSION}")
    payload: dict[str, Any] = torch.load(state_file, map_location="cpu", weights_only=True)
    return payload


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


class VolumeStorage:
    """The CheckpointStorage of a volume: each save is committed (and the older ones pruned to
    `keep`) before it returns."""

    def __init__(self, directory: Path, keep: int) -> None:
        self.directory = directory
        self.keep = keep
        self.location = str(directory)

    def read_newest(self) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
        path = latest_checkpoint(self.directory)
        if path is None:
            return None
        payload, meta = read_checkpoint(path)
        return path, payload, meta

    def save(self, packed: Packed, *, committed: Callable[[str], None], may_skip: bool) -> Path:
        path = write_checkpoint(self.directory, packed.step, packed.payload, packed.meta)
        prune(self.directory, self.keep)
        committed(str(path))
        return path

    def save_alone(self, packed: Packed, *, writer: str, committed: Callable[[str], None]) -> str:
        path = write_checkpoint(self.directory, packed.step, packed.payload, packed.meta, writer=writer)
        committed(str(path))
        return str(path)

    def wait(self, timeout: float | None = None) -> None:
        """Nothing to wait for: every save was committed when it returned."""
