"""Checkpoints committed to object storage (S3 or S3-compatible), fenced against stale attempts.

Object storage has no atomic rename, and a zombie rank of an old attempt (a pod on a lost node
still running, a worker that outlived its gang) can upload after the gang moved on. So a
checkpoint counts only once a commit names it, and commits go through one log whose entries
are created with `If-None-Match: *` (obstore's `mode="create"`): two writers can never both
append entry N, so the log has one order that every reader sees, the way Delta Lake's log
works on S3. Layout under `s3://bucket/prefix`:

    step-120-a3/state.pt     the payload of step 120 written by attempt 3 (uploaded first;
                             per attempt, so no other attempt ever overwrites these bytes)
    log/000000000007.json    {"kind": "attempt", "job": ..., "attempt": 3}: attempt 3 holds
                             the store from here on (appended before it reads anything)
    log/000000000008.json    {"kind": "commit", "job", "attempt", "step", "key", "size",
                             "sha256", "meta"}: step 120 counts from here on
    refused/a2-step-118.json a commit the log refused (see below)

The rule: a commit counts when the newest `attempt` entry before it is its own. An attempt
registers only if no newer attempt of the same job holds the store (a late starter of an old
attempt cannot take it back), and a new job on the same location takes it over (its
checkpoints resume like a volume's do, fingerprint permitting). A refused writer logs it,
leaves a `refused/` note that the holder's rank 0 reports (the operator turns the record into
a CheckpointRefused Event), and raises CommitRefused. Only rank 0 touches the store.

Pruning (by the holder, after each commit) deletes the payloads of every commit but the
newest `keep` valid ones, their log entries (never an `attempt` entry), and payloads no kept
commit names. A reader resumes the newest valid commit, which is never pruned: a holder's
commit after a reader registered is refused, so it prunes nothing.

Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_REGION, AWS_PROFILE...) through obstore; errors name the location
and never carry a secret.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubetrain.api.contract import ATTEMPT_ENV, JOB_UID_ENV
from kubetrain.api.training import ObjectStoreConfig
from kubetrain.trainer.checkpoint import CheckpointError

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

STATE_FILE = "state.pt"
LOG_PREFIX = "log/"
REFUSED_PREFIX = "refused/"
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
# A few quick retries, then the error: a store that is down must not hold a save (or the
# start of an attempt) for minutes. obstore retries 5xx, connection errors and timeouts.
RETRY_TRIES, RETRY_WITHIN = 3, datetime.timedelta(seconds=20)
CONNECT_TIMEOUT, REQUEST_TIMEOUT = datetime.timedelta(seconds=5), datetime.timedelta(seconds=600)


class StoreError(CheckpointError):
    """The object store failed or refused a request; the message names the location, no secret."""


class CommitRefused(StoreError):
    """A newer attempt holds the store: this attempt's commit (or registration) does not count."""


def split_url(url: str) -> tuple[str, str]:
    """(bucket, prefix without slashes) of `s3://bucket/prefix`."""
    if not url.startswith("s3://"):
        raise ValueError(f"{url!r} is not an s3:// URL")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    return bucket, prefix.strip("/")


def _scrub(text: str) -> str:
    # The SDK's messages carry URLs and status codes, never a key; make sure of it anyway.
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


@dataclass(frozen=True)
class Entry:
    """One log entry: an attempt taking the store, or a commit."""

    seq: int
    kind: str
    job: str
    attempt: int
    step: int | None = None
    key: str | None = None
    size: int | None = None
    sha256: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, seq: int, raw: bytes) -> Entry | None:
        try:
            data = json.loads(raw)
            return cls(
                seq=seq,
                kind=str(data["kind"]),
                job=str(data.get("job", "")),
                attempt=int(data["attempt"]),
                step=None if data.get("step") is None else int(data["step"]),
                key=data.get("key"),
                size=data.get("size"),
                sha256=data.get("sha256"),
                meta=dict(data.get("meta") or {}),
            )
        except (ValueError, KeyError, TypeError):
            return None  # not ours, or damaged: it counts for nothing

    def body(self) -> bytes:
        data: dict[str, Any] = {"kind": self.kind, "job": self.job, "attempt": self.attempt}
        if self.kind == "commit":
            data.update(step=self.step, key=self.key, size=self.size, sha256=self.sha256, meta=self.meta)
        return json.dumps(data, sort_keys=True).encode()


def valid_commits(entries: list[Entry]) -> list[Entry]:
    """The commits that count, oldest first: each made while its own attempt held the store."""
    holder: tuple[str, int] | None = None
    valid = []
    for entry in sorted(entries, key=lambda e: e.seq):
        if entry.kind == "attempt":
            holder = (entry.job, entry.attempt)
        elif entry.kind == "commit" and holder == (entry.job, entry.attempt):
            valid.append(entry)
    return valid


def holder_of(entries: list[Entry]) -> tuple[str, int] | None:
    """(job, attempt) of the newest `attempt` entry."""
    registrations = [e for e in entries if e.kind == "attempt"]
    return (registrations[-1].job, registrations[-1].attempt) if registrations else None


def _seq_of(path: str) -> int | None:
    name = path.rsplit("/", 1)[-1]
    stem = name[: -len(".json")] if name.endswith(".json") else ""
    return int(stem) if stem.isdigit() else None


class ObjectStore:
    """Rank 0's side of one checkpoint location: the log, the payloads, the prune."""

    def __init__(self, config: ObjectStoreConfig, *, job: str, attempt: int) -> None:
        from obstore.store import S3Store

        self.config = config
        self.job = job
        self.attempt = attempt
        self.bucket, self.prefix = split_url(config.url)
        options: ClientConfig = {"connect_timeout": CONNECT_TIMEOUT, "timeout": REQUEST_TIMEOUT}
        if config.endpoint and config.endpoint.startswith("http://"):
            options["allow_http"] = True
        retry: RetryConfig = {"max_retries": RETRY_TRIES, "retry_timeout": RETRY_WITHIN}
        kwargs: dict[str, Any] = {}
        if config.endpoint:
            kwargs["endpoint"] = config.endpoint
        region = config.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.store = S3Store(
            self.bucket,
            prefix=self.prefix or None,
            region=region,
            client_options=options,
            retry_config=retry,
            **kwargs,
        )
        self._entries: dict[int, Entry] = {}  # the log as far as read
        self._newest_seq = -1  # of any entry seen, ours or not: the next one is after it
        self.registered = False  # this attempt appended (or found) its `attempt` entry

    # -- names ---------------------------------------------------------------------------
    def url(self, key: str = "") -> str:
        base = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return f"{base}/{key}" if key else base

    def where(self) -> str:
        return self.url() + (f" (endpoint {self.config.endpoint})" if self.config.endpoint else "")

    def payload_dir(self, step: int, attempt: int | None = None) -> str:
        return f"step-{step}-a{self.attempt if attempt is None else attempt}"

    def _fail(self, doing: str, exc: BaseException) -> StoreError:
        kind = type(exc).__name__
        return StoreError(f"checkpoint store {self.where()}: {doing} failed: {kind}: {_scrub(str(exc))[:600]}")

    # -- the log -------------------------------------------------------------------------
    def read_log(self) -> list[Entry]:
        """Every entry of the log, oldest first (entries already read are not fetched again)."""
        import obstore

        try:
            # Entries are only ever created after the newest one: list from there on.
            after = f"{LOG_PREFIX}{self._newest_seq:012d}.json" if self._newest_seq >= 0 else None
            paths = [meta["path"] for page in obstore.list(self.store, LOG_PREFIX, offset=after) for meta in page]
            for path in paths:
                seq = _seq_of(path)
                if seq is None or seq in self._entries:
                    continue
                self._newest_seq = max(self._newest_seq, seq)
                entry = Entry.parse(seq, obstore.get(self.store, path).bytes().to_bytes())
                if entry is not None:
                    self._entries[seq] = entry
        except Exception as exc:
            raise self._fail("reading the commit log", exc) from exc
        return [self._entries[seq] for seq in sorted(self._entries)]

    def _append(self, make: Callable[[int, list[Entry]], Entry]) -> Entry:
        """Create the next log entry; `make(seq, log)` builds it from the log it follows (and
        raises CommitRefused to give up). Another writer's entry at that number: read again."""
        import obstore
        from obstore.exceptions import AlreadyExistsError

        for _ in range(100):
            entries = self.read_log()
            seq = self._newest_seq + 1
            entry = make(seq, entries)
            try:
                obstore.put(self.store, f"{LOG_PREFIX}{seq:012d}.json", entry.body(), mode="create")
            except AlreadyExistsError:
                continue
            except Exception as exc:
                raise self._fail(f"writing log entry {seq}", exc) from exc
            self._entries[seq] = entry
            self._newest_seq = seq
            return entry
        raise StoreError(f"checkpoint store {self.where()}: the commit log kept moving; gave up after 100 tries")

    def register(self) -> None:
        """This attempt takes the store (before it reads it); refused if a newer attempt of the
        same job holds it."""

        def make(seq: int, entries: list[Entry]) -> Entry:
            holder = holder_of(entries)
            if holder is not None and holder[0] == self.job and holder[1] > self.attempt:
                raise CommitRefused(
                    f"checkpoint store {self.where()}: attempt {holder[1]} of this job holds it; "
                    f"attempt {self.attempt} is stale and may not register"
                )
            return Entry(seq=seq, kind="attempt", job=self.job, attempt=self.attempt)

        if holder_of(self.read_log()) != (self.job, self.attempt):
            self._append(make)
        self.registered = True

    def latest(self) -> Entry | None:
        valid = valid_commits(self.read_log())
        return valid[-1] if valid else None

    # -- payloads --------------------------------------------------------------------------
    def upload(self, step: int, state_file: Path) -> tuple[str, int, str]:
        """Upload a staged state file; (key, size, sha256)."""
        import obstore

        key = f"{self.payload_dir(step)}/{STATE_FILE}"
        digest = hashlib.sha256()
        with state_file.open("rb") as f:
            for chunk in iter(lambda: f.read(8 << 20), b""):
                digest.update(chunk)
        size = state_file.stat().st_size
        try:
            with state_file.open("rb") as f:
                obstore.put(self.store, key, f, chunk_size=16 << 20, max_concurrency=8)
        except Exception as exc:
            raise self._fail(f"uploading {self.url(key)}", exc) from exc
        return key, size, digest.hexdigest()

    def commit(self, step: int, key: str, size: int, sha256: str, meta: dict[str, Any]) -> Entry:
        """Append this step's commit, unless another attempt holds the store: then leave a note
        the holder reports, and raise CommitRefused."""

        def make(seq: int, entries: list[Entry]) -> Entry:
            holder = holder_of(entries)
            if holder != (self.job, self.attempt):
                raise CommitRefused(
                    f"checkpoint store {self.where()}: the commit of step {step} by attempt {self.attempt} "
                    f"was refused: attempt {holder[1] if holder else '?'} holds the store (this attempt is stale)"
                )
            return Entry(
                seq=seq,
                kind="commit",
                job=self.job,
                attempt=self.attempt,
                step=step,
                key=key,
                size=size,
                sha256=sha256,
                meta=meta,
            )

        try:
            return self._append(make)
        except CommitRefused:
            self._note_refusal(step, key)
            raise

    def _note_refusal(self, step: int, key: str) -> None:
        import obstore

        holder = holder_of(list(self._entries.values()))
        note = {
            "attempt": self.attempt,
            "step": step,
            "path": self.url(key.rsplit("/", 1)[0]),
            "current_attempt": holder[1] if holder else None,
            "time": time.time(),
        }
        # The refusal itself is what matters; the note is for the holder's report.
        with contextlib.suppress(Exception):
            obstore.put(self.store, f"{REFUSED_PREFIX}a{self.attempt}-step-{step}.json", json.dumps(note).encode())

    def take_refusals(self) -> list[dict[str, Any]]:
        """The notes refused writers left, removed as they are taken (the holder reports each once)."""
        import obstore

        notes = []
        try:
            paths = [meta["path"] for page in obstore.list(self.store, REFUSED_PREFIX) for meta in page]
            for path in paths:
                with contextlib.suppress(ValueError):
                    notes.append(json.loads(obstore.get(self.store, path).bytes().to_bytes()))
                obstore.delete(self.store, path)
        except Exception as exc:
            raise self._fail("reading refusal notes", exc) from exc
        return notes

    def download(self, entry: Entry, into: Path) -> Path:
        """The payload of a commit, into a local file; checked against the commit's size and hash."""
        import obstore

        assert entry.key is not None
        into.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        try:
            with into.open("wb") as f:
                for chunk in obstore.get(self.store, entry.key).stream(min_chunk_size=8 << 20):
                    data = bytes(chunk)
                    digest.update(data)
                    size += len(data)
                    f.write(data)
        except Exception as exc:
            raise self._fail(f"downloading {self.url(entry.key)}", exc) from exc
        if size != entry.size or digest.hexdigest() != entry.sha256:
            hashed = "matches" if digest.hexdigest() == entry.sha256 else "differs"
            raise StoreError(
                f"checkpoint store {self.where()}: {self.url(entry.key)} does not match its commit "
                f"({size} bytes, expected {entry.size}; sha256 {hashed})"
            )
        return into

    def prune(self, keep: int) -> list[str]:
        """Delete every payload but those of the newest `keep` valid commits, and the log entries
        of the commits whose payloads went (attempt entries stay: they order the log)."""
        import obstore

        entries = self.read_log()
        valid = valid_commits(entries)
        kept = valid[-keep:]
        kept_dirs = {e.key.rsplit("/", 1)[0] for e in kept if e.key}
        oldest_kept = kept[0].seq if kept else None
        removed = []
        try:
            payloads: dict[str, list[str]] = {}
            for page in obstore.list(self.store):
                for meta in page:
                    top, _, rest = meta["path"].partition("/")
                    if top.startswith("step-") and rest:
                        payloads.setdefault(top, []).append(meta["path"])
            for name, paths in sorted(payloads.items()):
                if name not in kept_dirs:
                    obstore.delete(self.store, paths)
                    removed.append(name)
            stale = [
                e
                for e in entries
                if e.kind == "commit" and e not in kept and (oldest_kept is None or e.seq < oldest_kept)
            ]
            if stale:
                obstore.delete(self.store, [f"{LOG_PREFIX}{e.seq:012d}.json" for e in stale])
                for e in stale:
                    self._entries.pop(e.seq, None)
        except Exception as exc:
            raise self._fail("pruning", exc) from exc
        return removed


def job_identity() -> tuple[str, int]:
    """(job, attempt) this process writes as: the TrainingJob's UID (a local run's id) and the attempt."""
    raw = os.environ.get(ATTEMPT_ENV, "0")
    return os.environ.get(JOB_UID_ENV, ""), int(raw) if raw.isdigit() else 0


class Uploader:
    """One background upload at a time: stage -> upload -> commit -> prune, off the training thread.

    `start` waits for the previous upload first (the only stall besides the snapshot), `wait`
    blocks until the last one is committed. A failed upload is logged and training goes on (the
    next save tries again); a refused commit is raised at the next `start`/`wait`: a stale attempt
    must stop.
    """

    def __init__(self, store: ObjectStore, keep: int, warn: Callable[[str], None]) -> None:
        self.store = store
        self.keep = keep
        self.warn = warn
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(
        self, step: int, stage: Callable[[], Path], meta: dict[str, Any], on_commit: Callable[[Entry], None]
    ) -> None:
        """Run `stage` (it writes the checkpoint's folder and returns it), upload, commit and prune
        on a thread of their own, once the previous upload is done."""
        self.wait(raise_failures=False)
        self._thread = threading.Thread(
            target=self._run, args=(step, stage, meta, on_commit), name=f"kubetrain-upload-{step}", daemon=True
        )
        self._thread.start()

    def _run(
        self, step: int, stage: Callable[[], Path], meta: dict[str, Any], on_commit: Callable[[Entry], None]
    ) -> None:
        staged: Path | None = None
        try:
            if not self.store.registered:  # a script that saves without loading first registers here
                self.store.register()
            staged = stage()
            key, size, sha256 = self.store.upload(step, staged / STATE_FILE)
            entry = self.store.commit(step, key, size, sha256, meta)
            on_commit(entry)
            self.store.prune(self.keep)
        except BaseException as exc:  # surfaced by wait()
            self._error = exc
        finally:
            if staged is not None:
                _remove_tree(staged)

    def wait(self, *, raise_failures: bool = True) -> None:
        """Until the upload in flight is done. A refused commit always raises; another failure
        raises with `raise_failures` (a stop or final save must not claim what it did not write),
        else it is logged."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is None:
            return
        if isinstance(error, CommitRefused) or raise_failures:
            raise error
        self.warn(f"{error}; training goes on, the next checkpoint tries again")


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
