"""Atomic `step-N/` checkpoints; only rank 0 touches the directory.

Layout of `<dir>`:

    step-120/state.pt    torch.save of {"state": ..., "ranks": [per-rank RNG + loader state]}
    step-120/meta.json   written last; a step-N/ without it is incomplete and ignored
    metrics.jsonl        rank 0's metrics records (runtime/worker/metrics.py)

A save writes `state.pt` into `.tmp-step-N-<pid>/`, fsyncs it, renames the folder to
`step-N/` (fsyncing the parent), then writes `meta.json` through its own temporary name and
rename. A kill at any point leaves the previous complete checkpoint as the newest one.

On resume rank 0 reads the newest complete checkpoint and broadcasts it; each rank gets its
own RNG states scattered back. So only node 0 needs the volume, and NFS attribute caching
on other nodes cannot make a rank see an older checkpoint than rank 0.

With `object_store` (checkpoint.objectStore) `<dir>` only stages: rank 0 copies every tensor of
the checkpoint in memory and returns to training, while a background thread writes `step-N/`
into `<dir>/.staging/` (no fsync: the upload is what makes it durable), uploads it and appends its
commit (kubetrain.trainer.objectstore). Resume reads the newest commit whose payload is there and
matches it, walking back past those that do not (each named in a `checkpoint_skipped` record).
The stall per save is the copy, plus the wait for the previous upload when saves come faster than
uploads; the copy costs host memory of one checkpoint while its upload runs. A save never waits
on an upload that is stuck (objectstore.Uploader): a periodic one is skipped, training goes on,
and a stop's save waits for its own commit at most its grace period less STOP_MARGIN_S.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from kubetrain.api.contract import DEFAULT_GRACE_SECONDS, SHUTDOWN_TIMEOUT_ENV, unrecoverable
from kubetrain.api.training import ObjectStoreConfig

if TYPE_CHECKING:
    from kubetrain.runtime.worker.metrics import MetricsLogger
    from kubetrain.trainer.objectstore import Entry, ObjectStore, Uploader

STATE_FILE = "state.pt"
META_FILE = "meta.json"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-"
# What a stop's save leaves of the pods' grace period (PET_SHUTDOWN_TIMEOUT) for the barrier and the
# exit after its commit: a store that does not commit in time leaves the last commit standing.
STOP_MARGIN_S = 15.0
STAGING_SUBDIR = ".staging"  # under checkpoint.dir: where an object-store checkpoint waits for its upload


class CheckpointError(RuntimeError):
    """A checkpoint cannot be resumed (another configuration, world size or format), or its store
    failed or refused it (kubetrain.trainer.objectstore.StoreError)."""


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
        self.object_store = object_store
        self._store: ObjectStore | None = None
        self._uploader: Uploader | None = None
        self._identity = (job, attempt)
        if object_store is not None and rank == 0:
            from kubetrain.trainer import objectstore

            self._store = self._open_store(object_store)
            self._uploader = objectstore.Uploader(self._store, keep, _warn)
        self.skipped_saves = 0  # periodic saves not taken while an upload was stuck

    def _open_store(self, config: ObjectStoreConfig) -> ObjectStore:
        """The store as this job's attempt (default: KUBETRAIN_JOB_UID and KUBETRAIN_ATTEMPT) writes it."""
        from kubetrain.trainer import objectstore

        default_job, default_attempt = objectstore.job_identity()
        job, attempt = self._identity
        return objectstore.ObjectStore(
            config,
            job=default_job if job is None else job,
            attempt=default_attempt if attempt is None else attempt,
            rank=self.rank,
        )

    @property
    def location(self) -> str:
        """Where the checkpoints go: the directory, or the object store's URL."""
        return str(self.directory) if self.object_store is None else self.object_store.url

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
        if self._store is None or self._uploader is None:
            path = write_checkpoint(self.directory, step, payload, meta)
            prune(self.directory, self.keep)
            self._record("checkpoint", step=step, epoch=epoch, path=str(path), reason=reason)
            return path
        # One upload at a time: the stall when saves outrun uploads, but never on a stuck one. A
        # refused commit raises here (this attempt is stale and must stop).
        store, uploader = self._store, self._uploader
        must_commit = bool(wait or (wait is None and reason in ("signal", "final")))
        if not uploader.ready():
            running = uploader.running() or "the previous upload is stuck"
            if not must_commit:
                self.skipped_saves += 1
                self.last_step = saved_before  # not saved: rank 0's survivor save may still take it
                _warn(f"checkpoint of step {step} skipped: {running} (the store may be hung); training goes on")
                return None
            _warn(f"{running} (the store may be hung): step {step} is uploaded beside it, and counts first")
        # The stall: a copy of every tensor (training changes them from the next step on); the
        # serialisation into the staging dir, the upload and the commit run on the upload's thread.
        snapshot = _snapshot(payload)
        staging = self.directory / STAGING_SUBDIR

        def committed(entry: Entry) -> None:  # on the upload's thread
            self._record("checkpoint", step=step, epoch=epoch, path=store.url(entry.folder), reason=reason)
            self._report_refusals()

        def stage() -> Path:
            return write_checkpoint(staging, step, snapshot, meta, durable=False)

        uploader.start(step, stage, full_meta(step, meta), committed)
        if must_commit:
            self.wait(timeout=stop_bound() if reason == "signal" else None)
        return store.url(store.payload_dir(step))

    def _package(
        self, state: dict[str, Any], ranks: list[Any], reason: str | None, epoch: int | None
    ) -> tuple[dict[str, Any], dict[str, Any], int]:
        """(payload, meta, epoch) of a checkpoint of `state` with the ranks' RNG states `ranks`."""
        meta = {"fingerprint": self.fingerprint, "world_size": self.world_size, "reason": reason}
        return {"state": state, "ranks": ranks}, meta, epoch if epoch is not None else _int(state.get("epoch"))

    def save_alone(self, step: int, state: dict[str, Any], *, reason: str, epoch: int | None = None) -> str:
        """Save `state` from this rank alone, committed before it returns; its peers are gone, so no
        collective runs and the other ranks' RNG states are absent (None). Other survivors may save
        the same step at the same time: one copy is kept. Returns where it went."""
        ranks: list[Any] = [None] * self.world_size
        ranks[self.rank] = rng_state(self.generators)
        payload, meta, epoch = self._package(state, ranks, reason, epoch)
        writer = f"-rank{self.rank}"
        self.last_step = step
        if self.object_store is None:
            path = write_checkpoint(self.directory, step, payload, meta, writer=writer)
            self._record("checkpoint", step=step, epoch=epoch, path=str(path), reason=reason)
            return str(path)
        store = self._store or self._open_store(self.object_store)
        staged = write_checkpoint(self.directory / STAGING_SUBDIR, step, payload, meta, durable=False, writer=writer)
        try:
            key, size, digest = store.upload(step, staged / STATE_FILE)
            # Another survivor's commit of this step may come first: then that one holds it.
            entry = store.commit(step, key, size, digest, full_meta(step, meta))
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        where = store.url(entry.folder)
        if entry.step == step:
            self._record("checkpoint", step=step, epoch=epoch, path=where, reason=reason)
        return where

    def wait(self, timeout: float | None = None) -> None:
        """Rank 0: until the last save is committed (a no-op on a volume and on other ranks), or
        `timeout` s passed. Raises CheckpointError if it was not."""
        if self._uploader is not None:
            self._uploader.wait(timeout=timeout)

    def _record(self, event: str, **fields: Any) -> None:
        if self.metrics is not None:
            self.metrics.emit(event, **fields)

    def _report_refusals(self) -> None:
        """The holder's report of commits its store refused to stale attempts (once each)."""
        if self._store is None or self.metrics is None:
            return
        try:
            notes = self._store.take_refusals()
        except Exception as exc:  # a report, never a reason to stop training
            _warn(str(exc))
            return
        for note in notes:
            self._record(
                "checkpoint_refused",
                step=_int(note.get("step")),
                epoch=0,
                path=note.get("path"),
                # The record's own `attempt` is the reporting (holding) attempt's.
                refused_attempt=note.get("attempt"),
                current_attempt=note.get("current_attempt"),
            )

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

    def _read_newest(self) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        """Rank 0: (where, payload, meta) of the newest complete checkpoint, or None."""
        if self._store is None:
            path = latest_checkpoint(self.directory)
            if path is None:
                return None
            payload, meta = read_checkpoint(path)
            return str(path), payload, meta
        from kubetrain.trainer.objectstore import STATE_FILE as OBJECT_STATE_FILE
        from kubetrain.trainer.objectstore import PayloadUnusable, StoreError

        # What a killed attempt staged never counts (its commit is missing): its disk is freed.
        shutil.rmtree(self.directory / STAGING_SUBDIR, ignore_errors=True)
        self._store.register()  # this attempt holds the store from here on: a stale one's commits are refused
        self._report_refusals()
        unusable: list[str] = []
        for entry in self._store.resumable():
            where = self._store.url(entry.folder)
            try:
                local = self._store.download(entry, self.directory / STAGING_SUBDIR / ".resume" / OBJECT_STATE_FILE)
            except PayloadUnusable as exc:
                # A newer commit that cannot be read must not fail every attempt: the next one may.
                _warn(f"checkpoint of step {entry.step} skipped: {exc}")
                self._record("checkpoint_skipped", step=_int(entry.step), epoch=0, path=where, why=str(exc))
                unusable.append(f"step {entry.step}: {exc}")
                continue
            try:
                return where, read_state(local, entry.meta, where), entry.meta
            finally:
                local.unlink(missing_ok=True)
        if unusable:
            raise StoreError(
                f"checkpoint store {self._store.where()}: none of its {len(unusable)} commits can be resumed "
                f"({'; '.join(unusable)[:600]})"
            )
        return None

    def load(self) -> tuple[Path | str, dict[str, Any]] | None:
        """Rank 0 reads the newest complete checkpoint, every rank gets (where, state) and its RNG
        back: where is a Path on a volume, the object store's URL of it otherwise."""
        header: list[Any] = [None, None, None]  # error, where, step: what every rank learns
        payload: dict[str, Any] | None = None
        if self.rank == 0:
            try:
                newest = self._read_newest()
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
        return (where if self.object_store is not None else Path(where)), restored


def _snapshot(value: Any) -> Any:
    """`value` with every tensor copied to the CPU (GPU tensors: a device-to-host copy); the rest
    (numbers, strings, Python RNG state) is immutable or rebuilt by each state_dict() call."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _snapshot(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_snapshot(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_snapshot(item) for item in value)
    return value


def stop_bound() -> float:
    """How long a stop's save may wait for its commit: the grace period less STOP_MARGIN_S."""
    raw = os.environ.get(SHUTDOWN_TIMEOUT_ENV, "")
    grace = float(raw) if raw.replace(".", "", 1).isdigit() else float(DEFAULT_GRACE_SECONDS)
    return max(grace - STOP_MARGIN_S, 1.0)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _warn(message: str) -> None:
    from kubetrain.runtime.worker.metrics import log

    log.warning("%s", message)
