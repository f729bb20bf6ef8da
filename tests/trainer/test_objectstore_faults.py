"""Faults of checkpoints on object storage that must neither corrupt the store nor hold training,
against a real S3 server (SeaweedFS): a stale attempt's prune, two survivors saving one step with
different bytes, a newest commit whose payload is gone, a stale registration behind another
job's takeover, a server that accepts and never answers, a server paused mid-run, two jobs on one
prefix, and errors that no retry cures."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest
import torch
from support.s3server import S3Server, unique_bucket_name
from support.silent_server import SilentServer

from kubetrain.api.contract import find_unrecoverable
from kubetrain.api.training import ObjectStoreConfig
from kubetrain.runtime.worker.metrics import MetricsLogger
from kubetrain.trainer import objectstore
from kubetrain.trainer.checkpoint import Checkpointer, CheckpointError
from kubetrain.trainer.objectstore import ObjectStore, valid_commits

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def credentials(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)


def config(bucket: Any, endpoint: str | None = None) -> ObjectStoreConfig:
    return ObjectStoreConfig(url=bucket.url, endpoint=endpoint or bucket.server.endpoint)


def checkpointer(
    tmp_path: Path, bucket: Any, attempt: int, *, job: str = "job-j", rank: int = 0, **kwargs: Any
) -> Checkpointer:
    kwargs.setdefault("world_size", 1)
    return Checkpointer(
        tmp_path / f"staging-{job}-{attempt}-{rank}",
        rank=rank,
        object_store=config(bucket),
        job=job,
        attempt=attempt,
        **kwargs,
    )


def state(step: int, marker: int = 0) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(step)
    return {"step": step, "weights": torch.randn(1000, generator=generator) + marker, "epoch": 0}


def reader(bucket: Any) -> ObjectStore:
    return ObjectStore(config(bucket), job="reader", attempt=0)


def payloads(bucket: Any) -> list[str]:
    names = {meta["path"].split("/")[0] for meta in obstore.list(reader(bucket).store).collect()}
    return sorted(name for name in names if name.startswith("step-"))


def printed_records(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


# --- 1. a stale attempt's prune ------------------------------------------------------------


def test_a_stale_attempts_prune_deletes_nothing_a_newer_attempt_wrote(tmp_path: Path, s3_bucket: Any) -> None:
    """Attempt 1 reads the log and stalls (a GC pause, a partitioned pod); attempt 2 commits steps
    20 and 30; attempt 1 wakes and prunes from what it read. The next attempt must still resume
    step 30."""
    old = checkpointer(tmp_path, s3_bucket, 1, keep=1)
    old.load()
    old.save(10, state(10), wait=True)
    stale = old.storage.store
    assert stale is not None
    view = stale.read_log()  # what attempt 1 saw before it stalled

    newer = checkpointer(tmp_path, s3_bucket, 2, keep=2)
    newer.load()
    newer.save(20, state(20), wait=True)
    newer.save(30, state(30), wait=True)
    before = payloads(s3_bucket)

    stale.read_log = lambda: list(view)  # type: ignore[method-assign]  # it wakes, its view unchanged
    stale.prune(1)
    assert set(before) <= set(payloads(s3_bucket)), "the stale prune deleted a newer attempt's payload"
    where, restored = checkpointer(tmp_path, s3_bucket, 3).load()  # type: ignore[misc]
    assert str(where).endswith(newer.storage.store.payload_dir(30))  # type: ignore[union-attr]
    assert torch.equal(restored["weights"], state(30)["weights"])


def test_the_holders_prune_removes_superseded_uploads_and_old_commits(tmp_path: Path, s3_bucket: Any) -> None:
    """What a stale prune may not touch, the holder's own prune clears once it is garbage: the
    payload of an attempt that uploaded and was superseded before its commit, and commits past
    `keep`. A payload of a writer the log does not show superseded stays."""
    dead = checkpointer(tmp_path, s3_bucket, 0)
    dead.load()
    staged = tmp_path / "orphan.pt"
    torch.save(state(5), staged)
    orphan_key, _, _ = dead.storage.store.upload(5, staged)  # type: ignore[union-attr]  # killed before its commit
    unknown = "step-7-a9-r0-00000000/state.pt"  # a writer not (yet) in the log
    obstore.put(reader(s3_bucket).store, unknown, b"bytes")

    holder = checkpointer(tmp_path, s3_bucket, 1, keep=1)
    holder.load()
    for step in (10, 20):
        holder.save(step, state(step), wait=True)
    left = payloads(s3_bucket)
    assert orphan_key.split("/")[0] not in left and holder.storage.store.payload_dir(10) not in left  # type: ignore[union-attr]
    assert left == sorted([holder.storage.store.payload_dir(20), "step-7-a9-r0-00000000"])  # type: ignore[union-attr]


# --- 2. two survivors, different bytes ------------------------------------------------------


def test_two_survivors_saving_one_step_with_different_bytes_commit_it_once(tmp_path: Path, s3_bucket: Any) -> None:
    """Node 0's pod is gone, so every survivor saves (kubetrain.runtime.worker.survivor). Their bytes
    differ (each carries its own RNG state). In the order upload 1, upload 2, commit 2, commit 1
    the step must be committed once, from bytes that match the commit."""
    checkpointer(tmp_path, s3_bucket, 4).load()  # rank 0 registered attempt 4, then its pod went
    uploaded_1, committed_2 = threading.Event(), threading.Event()
    upload, commit = ObjectStore.upload, ObjectStore.commit

    def ordered_upload(self: ObjectStore, step: int, state_file: Path) -> Any:
        if threading.current_thread().name == "rank-2":
            assert uploaded_1.wait(60)
        done = upload(self, step, state_file)
        if threading.current_thread().name == "rank-1":
            uploaded_1.set()
        return done

    def ordered_commit(self: ObjectStore, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "rank-1":
            assert committed_2.wait(60)
        try:
            return commit(self, *args, **kwargs)
        finally:
            if threading.current_thread().name == "rank-2":
                committed_2.set()

    ObjectStore.upload, ObjectStore.commit = ordered_upload, ordered_commit  # type: ignore[method-assign]
    results: dict[int, Any] = {}
    try:

        def survive(rank: int) -> None:
            saver = checkpointer(tmp_path, s3_bucket, 4, rank=rank, world_size=3)
            try:
                results[rank] = saver.save_alone(9, state(9, marker=rank), reason="peer_lost")
            except Exception as exc:
                results[rank] = exc

        threads = [threading.Thread(target=survive, args=(rank,), name=f"rank-{rank}") for rank in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        ObjectStore.upload, ObjectStore.commit = upload, commit  # type: ignore[method-assign]
    assert not [r for r in results.values() if isinstance(r, Exception)], results

    commits = [e for e in valid_commits(reader(s3_bucket).read_log()) if e.step == 9]
    assert len(commits) == 1, f"step 9 committed {len(commits)} times"
    assert results[1] == results[2], "both survivors report the commit that holds the step"
    where, restored = checkpointer(tmp_path, s3_bucket, 5, resizable=True).load()  # type: ignore[misc]
    assert where == results[2] and torch.equal(restored["weights"], state(9, marker=2)["weights"])
    assert len([name for name in payloads(s3_bucket) if name.startswith("step-9-")]) == 1, "the loser's bytes went"


# --- 3. resume walks back -------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["missing", "mismatched"])
def test_resume_walks_back_past_a_newest_commit_it_cannot_use(
    tmp_path: Path, s3_bucket: Any, fault: str, capsys: pytest.CaptureFixture[str]
) -> None:
    saver = checkpointer(tmp_path, s3_bucket, 0, keep=3)
    saver.load()
    for step in (10, 20):
        saver.save(step, state(step), wait=True)
    newest = saver.storage.store.latest()  # type: ignore[union-attr]
    assert newest is not None and newest.key is not None
    store = reader(s3_bucket).store
    if fault == "missing":
        obstore.delete(store, newest.key)
    else:
        obstore.put(store, newest.key, b"not the committed bytes")

    resumer = checkpointer(tmp_path, s3_bucket, 1, metrics=MetricsLogger(0, None))
    where, restored = resumer.load()  # type: ignore[misc]
    assert str(where).endswith(saver.storage.store.payload_dir(10)) and restored["step"] == 10  # type: ignore[union-attr]
    (skipped,) = [r for r in printed_records(capsys) if r["event"] == "checkpoint_skipped"]
    assert skipped["step"] == 20 and skipped["path"].endswith(saver.storage.store.payload_dir(20))  # type: ignore[union-attr]
    assert ("missing" if fault == "missing" else "does not match its commit") in skipped["why"]


def test_resume_fails_saying_so_when_no_commit_can_be_used(tmp_path: Path, s3_bucket: Any) -> None:
    saver = checkpointer(tmp_path, s3_bucket, 0)
    saver.load()
    saver.save(10, state(10), wait=True)
    obstore.delete(reader(s3_bucket).store, f"{saver.storage.store.payload_dir(10)}/state.pt")  # type: ignore[union-attr]
    with pytest.raises(CheckpointError, match=r"none of its 1 commits can be resumed .*step 10: .* is missing"):
        checkpointer(tmp_path, s3_bucket, 1).load()


# --- 4. a stale registration behind another job's takeover ----------------------------------


def test_an_old_attempt_may_not_register_behind_another_jobs_takeover(tmp_path: Path, s3_bucket: Any) -> None:
    """Attempt 3 of job J holds the store, job K takes over, then attempt 2 of J starts late: it
    may not register, and its commit never becomes the newest."""
    checkpointer(tmp_path, s3_bucket, 3, job="job-j").load()
    taker = checkpointer(tmp_path, s3_bucket, 0, job="job-k")
    taker.load()
    taker.save(5, state(5), wait=True)
    late = checkpointer(tmp_path, s3_bucket, 2, job="job-j")
    with pytest.raises(CheckpointError, match="attempt 3 of this job registered; attempt 2 is stale"):
        late.load()
    with pytest.raises(CheckpointError):
        late.save(99, state(99), wait=True)
    newest = reader(s3_bucket).latest()
    assert newest is not None and (newest.job, newest.step) == ("job-k", 5)


# --- 5. a server that accepts and never answers --------------------------------------------


def bounded(call: Callable[[], Any], limit: float) -> tuple[float, BaseException | None]:
    """Run `call` on a thread; (seconds it took, what it raised). AssertionError if it is still
    running after `limit` s (the thread is left to its daemon's end)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still waiting after {limit:.0f} s"
    return time.monotonic() - started, outcome[0]


def test_a_store_that_never_answers_fails_the_start_within_its_bound(tmp_path: Path, s3_bucket: Any) -> None:
    with SilentServer() as silent:
        ckpt = Checkpointer(
            tmp_path, rank=0, world_size=1, object_store=config(s3_bucket, silent.endpoint), job="j", attempt=0
        )
        took, error = bounded(ckpt.load, 3 * objectstore.START_BOUND_S)
        assert silent.accepted > 0, "the client never reached the silent server"
    print(f"\na store that accepts and never answers: the start failed after {took:.1f} s")
    assert isinstance(error, CheckpointError) and "reading the commit log failed" in str(error), error
    assert f"endpoint {silent.endpoint}" in str(error) and "Debug source" not in str(error)


# --- 6. a store paused mid-run --------------------------------------------------------------


@pytest.fixture
def paused_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """A server of this test's own (it is SIGSTOPped); continued before it stops."""
    with S3Server() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        try:
            yield server
        finally:
            assert server.pid is not None
            os.kill(server.pid, signal.SIGCONT)


def test_a_store_that_stops_answering_mid_run_never_holds_training(
    tmp_path: Path, paused_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server is SIGSTOPped after a commit: saves every step go on without waiting on the hung
    upload (a periodic one is skipped), a stop's save gives up within its grace, and once the
    server answers again a save commits."""
    bucket = unique_bucket_name("paused")
    paused_server.create_bucket(bucket)
    url = f"s3://{bucket}/checkpoints"
    ckpt = Checkpointer(
        tmp_path, rank=0, world_size=1, object_store=ObjectStoreConfig(url=url, endpoint=paused_server.endpoint),
        job="j", attempt=0,
    )  # fmt: skip
    ckpt.load()
    ckpt.save(1, state(1), wait=True)
    assert paused_server.pid is not None
    os.kill(paused_server.pid, signal.SIGSTOP)

    gaps: list[float] = []
    skipped: list[int] = []

    def train() -> None:
        last = time.monotonic()
        for step in range(2, 32):
            time.sleep(0.05)  # the step
            if ckpt.save(step, state(step)) is None:
                skipped.append(step)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    took, error = bounded(train, 60)
    assert error is None, error
    assert ckpt.skipped_saves == len(skipped) >= 1, "every save waited its turn behind the hung upload"
    assert ckpt.last_step not in skipped, "a skipped step is not taken for saved (a survivor may still save it)"
    print(f"\nstore paused: 30 steps with a save each in {took:.1f} s, the longest gap between steps {max(gaps):.2f} s")

    monkeypatch.setenv("PET_SHUTDOWN_TIMEOUT", "20")  # the stop's save may wait 5 s for its commit
    took, error = bounded(lambda: ckpt.save(40, state(40), reason="signal"), 60)
    assert isinstance(error, CheckpointError) and "not committed within 5 s" in str(error), error
    print(f"store paused: the stop's save gave up after {took:.1f} s")

    os.kill(paused_server.pid, signal.SIGCONT)
    # The hung uploads end on their own bounds; a save once they did commits.
    deadline = time.monotonic() + 180
    step = 50
    while ckpt.save(step, state(step), wait=True) is None:
        assert time.monotonic() < deadline, "no save committed after the store came back"
        time.sleep(1)
        step += 1
    newest = reader_of(url, paused_server).latest()
    assert newest is not None and newest.step == step, "the newest commit is the last save's"


def reader_of(url: str, server: S3Server) -> ObjectStore:
    return ObjectStore(ObjectStoreConfig(url=url, endpoint=server.endpoint), job="reader", attempt=0)


# --- two jobs on one prefix, and errors no retry cures --------------------------------------


def test_a_job_whose_store_another_job_took_stops_at_once_naming_both(tmp_path: Path, s3_bucket: Any) -> None:
    first = checkpointer(tmp_path, s3_bucket, 0, job="job-j")
    first.load()
    first.save(10, state(10), wait=True)
    second = checkpointer(tmp_path, s3_bucket, 0, job="job-k")
    second.load()  # a new job on the same location takes it over (as a re-applied job must)
    with pytest.raises(CheckpointError) as caught:
        first.save(20, state(20), wait=True)
    found = find_unrecoverable(str(caught.value))
    assert found is not None and found[0] == "CheckpointStoreTakenOver", caught.value
    assert "job job-k" in found[1] and "job job-j" in found[1] and s3_bucket.url in found[1]
    with pytest.raises(CheckpointError, match="CheckpointStoreTakenOver"):
        checkpointer(tmp_path, s3_bucket, 0, job="job-j").load()  # its pod restarted: it may not take it back
    second.save(30, state(30), wait=True)
    newest = reader(s3_bucket).latest()
    assert newest is not None and (newest.job, newest.step) == ("job-k", 30)


@pytest.mark.parametrize(
    ("fault", "reason", "says"),
    [
        ("secret", "CheckpointStoreDenied", "403 Forbidden: SignatureDoesNotMatch"),
        ("bucket", "CheckpointStoreNotFound", "does not exist"),
        ("config", "CheckpointIncompatible", "different training configuration"),
    ],
)
def test_errors_no_retry_cures_are_marked_unrecoverable_with_the_cause_first(
    tmp_path: Path, s3_bucket: Any, monkeypatch: pytest.MonkeyPatch, fault: str, reason: str, says: str
) -> None:
    url = s3_bucket.url
    if fault == "secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + os.urandom(6).hex())
    elif fault == "bucket":
        url = "s3://" + unique_bucket_name("missing") + "/checkpoints"
    else:
        checkpointer(tmp_path, s3_bucket, 0, fingerprint="a").save(5, state(5), wait=True)
    ckpt = Checkpointer(
        tmp_path / "run",
        rank=0,
        world_size=1,
        object_store=ObjectStoreConfig(url=url, endpoint=s3_bucket.server.endpoint),
        job="job-j",
        attempt=1,
        fingerprint="b",
    )
    with pytest.raises(CheckpointError) as caught:
        ckpt.load()
    found = find_unrecoverable(str(caught.value))
    assert found is not None and found[0] == reason, caught.value
    assert found[1].startswith(("checkpoint store s3://", "refusing to resume s3://")) and says in found[1]
    assert "Debug source" not in found[1] and len(found[1]) < 600, found[1]
