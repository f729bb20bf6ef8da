"""Checkpoints on an object store, the CheckpointStorage of `checkpoint.objectStore`.

`<dir>` only stages: rank 0 copies every tensor of the checkpoint in memory and returns to
training, while a background thread writes `step-N/` into `<dir>/.staging/` (the volume's format,
no fsync: the upload is what makes it durable), uploads it and appends its commit
(kubetrain.trainer.objectstore). Resume reads the newest commit whose payload is there and matches
it, walking back past those that do not (each named in a `checkpoint_skipped` record).

The stall per save is the copy, plus the wait for the previous upload when saves come faster than
uploads; the copy costs host memory of one checkpoint while its upload runs. A save never waits on
an upload that is stuck (objectstore.Uploader): a periodic one is skipped and training goes on.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kubetrain.api.training import ObjectStoreConfig
from kubetrain.runtime.worker.metrics import MetricsLogger, log
from kubetrain.trainer.objectstore import Entry, ObjectStore, PayloadUnusable, StoreError, Uploader, job_identity
from kubetrain.trainer.storage import Packed, whole
from kubetrain.trainer.volume import STATE_FILE, full_meta, read_state, write_checkpoint

STAGING_SUBDIR = ".staging"  # under checkpoint.dir: where a checkpoint waits for its upload


class ObjectStoreStorage:
    """Rank 0 holds the store and its uploader; another rank opens the store only for a survivor's
    save. `job` and `attempt` (default: KUBETRAIN_JOB_UID and KUBETRAIN_ATTEMPT) fence a stale
    attempt's commits. With `metrics`, rank 0 logs a `checkpoint_refused` record for each stale
    commit the store refused, and a `checkpoint_skipped` one for each commit a resume walked past."""

    def __init__(
        self,
        directory: Path,
        config: ObjectStoreConfig,
        *,
        rank: int,
        keep: int,
        job: str | None,
        attempt: int | None,
        metrics: MetricsLogger | None,
    ) -> None:
        self.config = config
        self.location = config.url
        self.staging = directory / STAGING_SUBDIR
        self.rank = rank
        self.metrics = metrics
        self._identity = (job, attempt)
        self.store: ObjectStore | None = None
        self.uploader: Uploader | None = None
        if rank == 0:
            self.store = self._open()
            self.uploader = Uploader(self.store, keep, _warn)

    def _open(self) -> ObjectStore:
        """The store as this job's attempt (default: KUBETRAIN_JOB_UID and KUBETRAIN_ATTEMPT) writes it."""
        default_job, default_attempt = job_identity()
        job, attempt = self._identity
        return ObjectStore(
            self.config,
            job=default_job if job is None else job,
            attempt=default_attempt if attempt is None else attempt,
            rank=self.rank,
        )

    def _holder(self) -> tuple[ObjectStore, Uploader]:
        assert self.store is not None and self.uploader is not None, "only rank 0 saves and resumes"
        return self.store, self.uploader

    def read_newest(self) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        store, _ = self._holder()
        # What a killed attempt staged never counts (its commit is missing): its disk is freed.
        shutil.rmtree(self.staging, ignore_errors=True)
        store.register()  # this attempt holds the store from here on: a stale one's commits are refused
        self._report_refusals()
        unusable: list[str] = []
        for entry in store.resumable():
            where = store.url(entry.folder)
            try:
                local = store.download(entry, self.staging / ".resume" / STATE_FILE)
            except PayloadUnusable as exc:
                # A newer commit that cannot be read must not fail every attempt: the next one may.
                _warn(f"checkpoint of step {entry.step} skipped: {exc}")
                self._record("checkpoint_skipped", step=whole(entry.step), epoch=0, path=where, why=str(exc))
                unusable.append(f"step {entry.step}: {exc}")
                continue
            try:
                return where, read_state(local, entry.meta, where), entry.meta
            finally:
                local.unlink(missing_ok=True)
        if unusable:
            raise StoreError(
                f"checkpoint store {store.where()}: none of its {len(unusable)} commits can be resumed "
                f"({'; '.join(unusable)[:600]})"
            )
        return None

    def save(self, packed: Packed, *, committed: Callable[[str], None], may_skip: bool) -> str | None:
        step, meta = packed.step, packed.meta
        store, uploader = self._holder()
        # One upload at a time: the stall when saves outrun uploads, but never on a stuck one. A
        # refused commit raises here (this attempt is stale and must stop).
        if not uploader.ready():
            running = uploader.running() or "the previous upload is stuck"
            if may_skip:
                _warn(f"checkpoint of step {step} skipped: {running} (the store may be hung); training goes on")
                return None
            _warn(f"{running} (the store may be hung): step {step} is uploaded beside it, and counts first")
        # The stall: a copy of every tensor (training changes them from the next step on); the
        # serialisation into the staging dir, the upload and the commit run on the upload's thread.
        snapshot = _snapshot(packed.payload)

        def on_commit(entry: Entry) -> None:  # on the upload's thread
            committed(store.url(entry.folder))
            self._report_refusals()

        def stage() -> Path:
            return write_checkpoint(self.staging, step, snapshot, meta, durable=False)

        uploader.start(step, stage, full_meta(step, meta), on_commit)
        return store.url(store.payload_dir(step))

    def save_alone(self, packed: Packed, *, writer: str, committed: Callable[[str], None]) -> str:
        step, meta = packed.step, packed.meta
        store = self.store or self._open()
        staged = write_checkpoint(self.staging, step, packed.payload, meta, durable=False, writer=writer)
        try:
            key, size, digest = store.upload(step, staged / STATE_FILE)
            # Another survivor's commit of this step may come first: then that one holds it.
            entry = store.commit(step, key, size, digest, full_meta(step, meta))
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        where = store.url(entry.folder)
        if entry.step == step:
            committed(where)
        return where

    def wait(self, timeout: float | None = None) -> None:
        """Rank 0: until the last upload is committed (a no-op on other ranks)."""
        if self.uploader is not None:
            self.uploader.wait(timeout=timeout)

    def _record(self, event: str, **fields: Any) -> None:
        if self.metrics is not None:
            self.metrics.emit(event, **fields)

    def _report_refusals(self) -> None:
        """The holder's report of commits its store refused to stale attempts (once each)."""
        # Without metrics the notes stay in the store: taking them deletes them.
        if self.store is None or self.metrics is None:
            return
        try:
            notes = self.store.take_refusals()
        except Exception as exc:  # a report, never a reason to stop training
            _warn(str(exc))
            return
        for note in notes:
            self._record(
                "checkpoint_refused",
                step=whole(note.get("step")),
                epoch=0,
                path=note.get("path"),
                # The record's own `attempt` is the reporting (holding) attempt's.
                refused_attempt=note.get("attempt"),
                current_attempt=note.get("current_attempt"),
            )


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


def _warn(message: str) -> None:
    log.warning("%s", message)
