"""Checkpoints committed to object storage (S3 or S3-compatible), fenced against stale attempts.

Object storage has no atomic rename, and a zombie rank of an old attempt (a pod on a lost node
still running, a worker that outlived its gang) can upload after the gang moved on. So a
checkpoint counts only once a commit names it, and commits go through one log whose entries
are created with `If-None-Match: *` (obstore's `mode="create"`): two writers can never both
append entry N, so the log has one order that every reader sees, the way Delta Lake's log
works on S3. Layout under `s3://bucket/prefix`:

    step-120-a3-r0-1f2e3d4c/state.pt  the payload of step 120 written by rank 0 of attempt 3 of
                             the job whose UID hashes to 1f2e3d4c (uploaded first; one writer
                             per key, so no other writer ever overwrites these bytes)
    log/000000000007.json    {"kind": "attempt", "job": ..., "attempt": 3}: attempt 3 holds
                             the store from here on (appended before it reads anything)
    log/000000000008.json    {"kind": "commit", "job", "attempt", "step", "key", "size",
                             "sha256", "meta"}: step 120 counts from here on
    refused/a2-step-118.json a commit the log refused (see below)

The rules:
- A commit counts when the newest `attempt` entry before it is its own.
- An attempt registers only if no attempt of the same job with a higher number ever registered
  (a late starter of an old attempt cannot take the store back, whoever holds it now), and not
  again once another job took the store from it. A new job on the same location takes it over
  (its checkpoints resume like a volume's do, fingerprint permitting): the job it took the store
  from fails at once at its next commit (CheckpointStoreTakenOver), instead of taking it back.
- One commit per step and attempt: survivors that save the same step (kubetrain.runtime.worker.survivor)
  upload to keys of their own, the first commit wins, the others remove their bytes; an upload
  that lands after a newer step of its attempt was committed is not committed at all.
- A refused writer logs it, leaves a `refused/` note that the holder's rank 0 reports (the
  operator turns the record into a CheckpointRefused Event), and raises CommitRefused.

Pruning (by the holder, after each commit) deletes the payloads and log entries of the commits
older than the newest `keep` valid ones (never an `attempt` entry), and the uncommitted payloads
of writers its view of the log shows superseded. It may run on a stale view (a writer that stalled
after reading the log): commits only ever join the log after what it saw, so what is old in its
view is as old in the log, and a payload of a writer it has not seen registered is never touched.
A reader resumes the newest valid commit whose payload is there and matches it, walking back
past those that do not (`ObjectStore.resumable`).

Every request is bounded: a small one (the log, a note, a listing) by SMALL_TIMEOUT and its
retries, a payload by its size at MIN_RATE plus a floor. A store that accepts connections and
never answers fails the start of an attempt within about START_BOUND_S.

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
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubetrain.api.contract import JOB_UID_ENV, unrecoverable
from kubetrain.api.training import ObjectStoreConfig
from kubetrain.runtime.store import gang_attempt
from kubetrain.trainer.storage import CheckpointError

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Store

STATE_FILE = "state.pt"
LOG_PREFIX = "log/"
REFUSED_PREFIX = "refused/"
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
# A few quick retries, then the error: a store that is down must not hold a save (or the start of
# an attempt) for minutes. obstore retries 5xx, connection errors and timeouts. A small request
# (a log entry, a listing, a note) that takes longer than SMALL_TIMEOUT is not coming.
RETRY_TRIES = 2
CONNECT_TIMEOUT = datetime.timedelta(seconds=5)
SMALL_TIMEOUT, SMALL_RETRY_WITHIN = datetime.timedelta(seconds=5), datetime.timedelta(seconds=10)
# A hung store fails the first request of an attempt's start (its log) within this, measured
# with a server that accepts connections and never answers: ~10 s.
START_BOUND_S = 15
# A payload's requests: a floor, plus its bytes at MIN_RATE (a part of CHUNK_BYTES when it goes up
# in parts, the whole object when it comes down).
PAYLOAD_FLOOR_S, MIN_RATE, CHUNK_BYTES = 30.0, 2 << 20, 16 << 20
# An upload still running this long, or three times the longest that completed if that is more,
# is stuck (a store that stopped answering, a network partition): a save does not wait on it.
STUCK_FLOOR_S = 5.0
# The payload folder: step, attempt, rank, and a hash of the job (two jobs may share a location
# one after the other, and their attempt numbers overlap).
_PAYLOAD_DIR = re.compile(r"^step-(?P<step>\d+)-a(?P<attempt>\d+)-r(?P<rank>\d+)-(?P<job>[0-9a-f]{8})$")
_S3_CODE = re.compile(r"<Code>(?P<code>[^<]+)</Code>(?:<Message>(?P<message>[^<]*)</Message>)?")
_STATUS = re.compile(r"status code: (?P<status>\d{3}) (?P<text>[A-Za-z ]+)")


class StoreError(CheckpointError):
    """The object store failed or refused a request; the message names the location, no secret."""


class CommitRefused(StoreError):
    """A newer attempt holds the store: this attempt's commit (or registration) does not count."""


class Unrecoverable(StoreError):
    """No retry can cure it (the credentials, the bucket, another job holding the store): its
    message carries api.contract's unrecoverable mark, and the job fails at once."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(unrecoverable(reason, message))
        self.reason = reason


class StoreTakenOver(CommitRefused, Unrecoverable):
    """Another job took the store over: this job may not take it back (two jobs on one location)."""

    def __init__(self, message: str) -> None:
        Unrecoverable.__init__(self, "CheckpointStoreTakenOver", message)


class PayloadUnusable(StoreError):
    """A commit's payload is missing, or does not match its commit: resume walks back past it."""


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


def explain(exc: BaseException) -> str:
    """An SDK error in one line: the HTTP status and S3's code and message when the server sent
    them, else the error's first line; never the client's debug dump that follows it."""
    text = _scrub(str(exc))
    status, code = _STATUS.search(text), _S3_CODE.search(text)
    if status is not None:
        said = f"{status['status']} {status['text'].strip()}"
        if code is not None:
            said += f": {code['code']}" + (f" ({code['message']})" if code["message"] else "")
        return said
    first = text.split("\n\nDebug source:", 1)[0].strip().splitlines()
    return f"{type(exc).__name__}: {first[-1] if first else ''}"[:300]


def job_tag(job: str) -> str:
    """The job's part of its payload folders' names."""
    return hashlib.sha256(job.encode()).hexdigest()[:8]


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

    @property
    def folder(self) -> str:
        """A commit's payload folder (the key without its file name)."""
        return (self.key or "").rsplit("/", 1)[0]


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


def superseded(entries: list[Entry]) -> set[tuple[str, int]]:
    """(job tag, attempt) of every writer the log shows superseded: registered, then followed by
    another attempt's registration. Its uncommitted bytes can never be committed."""
    registrations = [e for e in sorted(entries, key=lambda e: e.seq) if e.kind == "attempt"]
    done = set()
    for index, entry in enumerate(registrations):
        writer = (entry.job, entry.attempt)
        later = [(e.job, e.attempt) for e in registrations[index + 1 :]]
        if later and writer not in later:
            done.add((job_tag(entry.job), entry.attempt))
    return done


def _seq_of(path: str) -> int | None:
    name = path.rsplit("/", 1)[-1]
    stem = name[: -len(".json")] if name.endswith(".json") else ""
    return int(stem) if stem.isdigit() else None


class ObjectStore:
    """One writer's side of a checkpoint location (rank 0, or a survivor): the log, the
    payloads, the prune."""

    def __init__(self, config: ObjectStoreConfig, *, job: str, attempt: int, rank: int = 0) -> None:
        self.config = config
        self.job = job
        self.attempt = attempt
        self.rank = rank
        self.bucket, self.prefix = split_url(config.url)
        self.store = self._client(SMALL_TIMEOUT, SMALL_RETRY_WITHIN)
        self._entries: dict[int, Entry] = {}  # the log as far as read
        self._newest_seq = -1  # of any entry seen, ours or not: the next one is after it
        self.registered = False  # this attempt appended (or found) its `attempt` entry

    def _client(self, timeout: datetime.timedelta, retry_within: datetime.timedelta) -> S3Store:
        from obstore.store import S3Store

        options: ClientConfig = {"connect_timeout": CONNECT_TIMEOUT, "timeout": timeout}
        if self.config.endpoint and self.config.endpoint.startswith("http://"):
            options["allow_http"] = True
        retry: RetryConfig = {"max_retries": RETRY_TRIES, "retry_timeout": retry_within}
        kwargs: dict[str, Any] = {}
        if self.config.endpoint:
            kwargs["endpoint"] = self.config.endpoint
        env_region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        return S3Store(
            self.bucket,
            prefix=self.prefix or None,
            region=self.config.region or env_region or "us-east-1",
            client_options=options,
            retry_config=retry,
            **kwargs,
        )

    def _payload_client(self, size: int) -> S3Store:
        """A client whose requests are bounded for `size` bytes each."""
        timeout = datetime.timedelta(seconds=PAYLOAD_FLOOR_S + size / MIN_RATE)
        return self._client(timeout, timeout * (RETRY_TRIES + 1))

    # -- names ---------------------------------------------------------------------------
    def url(self, key: str = "") -> str:
        base = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return f"{base}/{key}" if key else base

    def where(self) -> str:
        return self.url() + (f" (endpoint {self.config.endpoint})" if self.config.endpoint else "")

    def payload_dir(self, step: int) -> str:
        """This writer's folder for `step`."""
        return f"step-{step}-a{self.attempt}-r{self.rank}-{job_tag(self.job)}"

    def _fail(self, doing: str, exc: BaseException) -> StoreError:
        said = explain(exc)
        if " 401 " in f" {said}" or " 403 " in f" {said}":
            return Unrecoverable(
                "CheckpointStoreDenied",
                f"checkpoint store {self.where()} refused {doing}: {said}; check the credentials "
                "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; checkpoint.objectStore.credentialsSecret) and what "
                "they may do in the bucket",
            )
        if "NoSuchBucket" in said:
            return Unrecoverable(
                "CheckpointStoreNotFound",
                f"checkpoint store {self.where()}: bucket {self.bucket} does not exist ({doing}: {said}); "
                "create it, or fix checkpoint.objectStore.url",
            )
        return StoreError(f"checkpoint store {self.where()}: {doing} failed: {said}")

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
        raises to give up, or returns an entry already in the log to settle without writing).
        Another writer's entry at that number: read again."""
        import obstore
        from obstore.exceptions import AlreadyExistsError

        for _ in range(100):
            entries = self.read_log()
            seq = self._newest_seq + 1
            entry = make(seq, entries)
            if entry.seq != seq:
                return entry
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

    def _taken_from_us(self, entries: list[Entry]) -> Entry | None:
        """The registration of another job after this attempt's own, if any: the store was taken."""
        mine = [e.seq for e in entries if e.kind == "attempt" and (e.job, e.attempt) == (self.job, self.attempt)]
        if not mine:
            return None
        return next((e for e in entries if e.kind == "attempt" and e.seq > mine[-1] and e.job != self.job), None)

    def _taken_over(self, taker: Entry, doing: str) -> StoreTakenOver:
        return StoreTakenOver(
            f"checkpoint store {self.where()} was taken over by job {taker.job} (its attempt {taker.attempt}) while "
            f"job {self.job or '?'} attempt {self.attempt} used it: {doing} refused, this job stops; two jobs cannot "
            "share one checkpoint.objectStore.url (give each its own prefix; to resume another job's checkpoints, "
            "start the new job once the old one is gone)"
        )

    def register(self) -> None:
        """This attempt takes the store (before it reads it); refused if an attempt of the same job
        with a higher number ever registered, or once another job took the store from it."""

        def make(seq: int, entries: list[Entry]) -> Entry:
            newer = [e for e in entries if e.kind == "attempt" and e.job == self.job and e.attempt > self.attempt]
            if newer:
                raise CommitRefused(
                    f"checkpoint store {self.where()}: attempt {newer[-1].attempt} of this job registered; "
                    f"attempt {self.attempt} is stale and may not register"
                )
            taker = self._taken_from_us(entries)
            if taker is not None:
                raise self._taken_over(taker, f"registering attempt {self.attempt} again")
            holder = holder_of(entries)
            if holder is not None and holder[0] != self.job:
                _warn(
                    f"checkpoint store {self.where()}: job {self.job or '?'} takes it over from job {holder[0]} "
                    f"(attempt {holder[1]}), and resumes its newest checkpoint"
                )
            return Entry(seq=seq, kind="attempt", job=self.job, attempt=self.attempt)

        if holder_of(self.read_log()) != (self.job, self.attempt):
            self._append(make)
        self.registered = True

    def latest(self) -> Entry | None:
        valid = valid_commits(self.read_log())
        return valid[-1] if valid else None

    def resumable(self) -> list[Entry]:
        """The valid commits, newest first: what a reader tries in turn."""
        return list(reversed(valid_commits(self.read_log())))

    # -- payloads --------------------------------------------------------------------------
    def upload(self, step: int, state_file: Path) -> tuple[str, int, str]:
        """Upload a staged state file to this writer's own key; (key, size, sha256)."""
        import obstore

        key = f"{self.payload_dir(step)}/{STATE_FILE}"
        digest = hashlib.sha256()
        with state_file.open("rb") as f:
            for chunk in iter(lambda: f.read(8 << 20), b""):
                digest.update(chunk)
        size = state_file.stat().st_size
        try:
            with state_file.open("rb") as f:
                client = self._payload_client(min(size, CHUNK_BYTES))
                obstore.put(client, key, f, chunk_size=CHUNK_BYTES, max_concurrency=8)
        except Exception as exc:
            raise self._fail(f"uploading {self.url(key)}", exc) from exc
        return key, size, digest.hexdigest()

    def discard(self, key: str) -> None:
        """Remove this writer's uploaded bytes that no commit names (best effort: prune finds them)."""
        import obstore

        with contextlib.suppress(Exception):
            obstore.delete(self.store, key)

    def commit(self, step: int, key: str, size: int, sha256: str, meta: dict[str, Any]) -> Entry:
        """Append this step's commit, unless another attempt holds the store: then leave a note the
        holder reports, and raise CommitRefused. Returns the commit that holds `step`: this one, or
        one of this attempt already in the log (another survivor's, whose bytes count; `key` is then
        discarded); or the newer step of this attempt already committed (nothing is then written)."""

        def make(seq: int, entries: list[Entry]) -> Entry:
            holder = holder_of(entries)
            if holder != (self.job, self.attempt):
                taker = self._taken_from_us(entries)
                if taker is not None:
                    raise self._taken_over(taker, f"the commit of step {step}")
                if holder is None:
                    holding = "nobody holds the store"
                elif holder[0] == self.job:
                    holding = f"attempt {holder[1]} of this job holds the store"
                else:
                    holding = f"job {holder[0]} (attempt {holder[1]}) holds the store"
                raise CommitRefused(
                    f"checkpoint store {self.where()}: the commit of step {step} by attempt {self.attempt} "
                    f"was refused: {holding} (this attempt is stale)"
                )
            ours = [e for e in valid_commits(entries) if (e.job, e.attempt) == (self.job, self.attempt)]
            settled = next((e for e in ours if e.step is not None and e.step >= step), None)
            if settled is not None:
                return settled
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
            entry = self._append(make)
        except StoreTakenOver:
            raise
        except CommitRefused:
            self._note_refusal(step, key)
            raise
        if entry.key != key:
            self.discard(key)
        return entry

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
        """The payload of a commit, into a local file; checked against the commit's size and hash.
        PayloadUnusable when it is gone or does not match."""
        import obstore

        assert entry.key is not None
        into.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        try:
            with into.open("wb") as f:
                client = self._payload_client(entry.size or 0)
                for chunk in obstore.get(client, entry.key).stream(min_chunk_size=8 << 20):
                    data = bytes(chunk)
                    digest.update(data)
                    size += len(data)
                    f.write(data)
        except FileNotFoundError as exc:
            raise PayloadUnusable(f"{self.url(entry.key)} is missing ({explain(exc)})") from exc
        except Exception as exc:
            raise self._fail(f"downloading {self.url(entry.key)}", exc) from exc
        if size != entry.size or digest.hexdigest() != entry.sha256:
            hashed = "matches" if digest.hexdigest() == entry.sha256 else "differs"
            raise PayloadUnusable(
                f"{self.url(entry.key)} does not match its commit "
                f"({size} bytes, expected {entry.size}; sha256 {hashed})"
            )
        return into

    def prune(self, keep: int) -> list[str]:
        """Delete the payloads and log entries of the valid commits older than the newest `keep`
        (attempt entries stay: they order the log), and the payloads of superseded writers that
        no commit names. Safe on a stale view of the log (the module docstring)."""
        import obstore

        entries = self.read_log()
        valid = valid_commits(entries)
        kept = valid[-keep:]
        old = valid[: len(valid) - len(kept)]
        named = {e.folder for e in entries if e.kind == "commit"}
        gone = superseded(entries)
        removed = []
        try:
            payloads: dict[str, list[str]] = {}
            for page in obstore.list(self.store):
                for meta in page:
                    top, _, rest = meta["path"].partition("/")
                    if top.startswith("step-") and rest:
                        payloads.setdefault(top, []).append(meta["path"])
            doomed = {e.folder for e in old}
            for name in payloads:
                parsed = _PAYLOAD_DIR.match(name)
                if name not in named and parsed and (parsed["job"], int(parsed["attempt"])) in gone:
                    doomed.add(name)
            for name in sorted(doomed & payloads.keys()):
                obstore.delete(self.store, payloads[name])
                removed.append(name)
            if old:
                obstore.delete(self.store, [f"{LOG_PREFIX}{e.seq:012d}.json" for e in old])
                for e in old:
                    self._entries.pop(e.seq, None)
        except Exception as exc:
            raise self._fail("pruning", exc) from exc
        return removed


def job_identity() -> tuple[str, int]:
    """(job, attempt) this process writes as: the TrainingJob's UID (a local run's id) and the attempt."""
    return os.environ.get(JOB_UID_ENV, ""), gang_attempt() or 0


class Uploader:
    """Background uploads: stage -> upload -> commit -> prune, off the training thread.

    `ready` waits for the previous upload, but never on one that is stuck (running over
    STUCK_FLOOR_S, or three times the longest upload that completed): that one is abandoned (it
    ends with its requests' bounds; it commits nothing once a newer step of this attempt is
    committed) and the caller skips or goes on. `wait` blocks until the last upload is
    committed, within an optional bound. A failed upload is logged and training goes on (the next
    save tries again); a refused commit is raised at the next `ready`/`wait`: a stale attempt must
    stop.
    """

    def __init__(self, store: ObjectStore, keep: int, warn: Callable[[str], None]) -> None:
        self.store = store
        self.keep = keep
        self.warn = warn
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._step: int | None = None
        self._longest = 0.0
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()

    def stuck_after(self) -> float:
        return max(STUCK_FLOOR_S, 3 * self._longest)

    def ready(self) -> bool:
        """Whether a new upload may start: the previous one ended (waited for, up to its stuck
        bound), or none runs. False while a stuck one runs: it is left to end on its own."""
        thread = self._thread
        if thread is not None:
            thread.join(max(0.0, self._started + self.stuck_after() - time.monotonic()))
            if thread.is_alive():
                return False
            self._thread = None
        self._raise_refusal()
        return True

    def running(self) -> str | None:
        """What the upload in flight is, for a message: None when none runs."""
        if self._thread is None or not self._thread.is_alive():
            return None
        return f"the upload of step {self._step} has run {time.monotonic() - self._started:.0f} s"

    def start(
        self, step: int, stage: Callable[[], Path], meta: dict[str, Any], on_commit: Callable[[Entry], None]
    ) -> None:
        """Run `stage` (it writes the checkpoint's folder and returns it), upload, commit and prune
        on a thread of their own. The caller asked `ready` first (or abandons a stuck one)."""
        self._thread = threading.Thread(
            target=self._run, args=(step, stage, meta, on_commit), name=f"kubetrain-upload-{step}", daemon=True
        )
        self._started, self._step = time.monotonic(), step
        self._thread.start()

    def _run(
        self, step: int, stage: Callable[[], Path], meta: dict[str, Any], on_commit: Callable[[Entry], None]
    ) -> None:
        staged: Path | None = None
        began = time.monotonic()
        try:
            if not self.store.registered:  # a script that saves without loading first registers here
                self.store.register()
            staged = stage()
            key, size, sha256 = self.store.upload(step, staged / STATE_FILE)
            entry = self.store.commit(step, key, size, sha256, meta)
            if entry.step == step:
                on_commit(entry)
            else:
                self.warn(f"step {step}'s upload ended after step {entry.step} was committed: it counts for nothing")
            self.store.prune(self.keep)
            with self._lock:
                self._longest = max(self._longest, time.monotonic() - began)
        except BaseException as exc:  # surfaced by ready() or wait()
            with self._lock:
                self._errors.append(exc)
        finally:
            if staged is not None:
                _remove_tree(staged)

    def _take_errors(self) -> list[BaseException]:
        with self._lock:
            errors, self._errors = self._errors, []
        return errors

    def _raise_refusal(self) -> None:
        for error in self._take_errors():
            if isinstance(error, CommitRefused):
                raise error
            self.warn(f"{error}; training goes on, the next checkpoint tries again")

    def wait(self, *, raise_failures: bool = True, timeout: float | None = None) -> None:
        """Until the upload in flight is done, or `timeout` s passed (then a StoreError with
        `raise_failures`). A refused commit always raises; another failure raises with
        `raise_failures` (a stop or final save must not claim what it did not write), else it is
        logged."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                if raise_failures:
                    raise StoreError(
                        f"checkpoint store {self.store.where()}: step {self._step} was not committed within "
                        f"{timeout:.0f} s (the store may be hung); the last commit stands"
                    )
                return
            self._thread = None
        errors = self._take_errors()
        refused = next((e for e in errors if isinstance(e, CommitRefused)), None)
        if refused is not None:
            raise refused
        if errors and raise_failures:
            raise errors[-1]
        for error in errors:
            self.warn(f"{error}; training goes on, the next checkpoint tries again")


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _warn(message: str) -> None:
    import logging

    logging.getLogger("kubetrain.trainer").warning("%s", message)
