"""Checkpoints on object storage against a real S3 server (SeaweedFS, tests/support/s3server.py):
commits, resume, the fence against stale attempts, kills during an upload, bad credentials."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import obstore
import pytest
import torch
from support.controlplane import free_port
from support.waiting import wait_for

from kubetrain.api.training import ObjectStoreConfig
from kubetrain.runtime.worker.metrics import MetricsLogger
from kubetrain.trainer.checkpoint import Checkpointer, CheckpointError
from kubetrain.trainer.objectstore import LOG_PREFIX, ObjectStore, job_tag, valid_commits

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def credentials(s3_bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's keys where the trainer's client reads them, as a pod's env has them (without
    them obstore would ask the EC2 metadata service)."""
    for name, value in s3_bucket.server.env().items():
        monkeypatch.setenv(name, value)


def config(bucket: Any, endpoint: str | None = None) -> ObjectStoreConfig:
    return ObjectStoreConfig(url=bucket.url, endpoint=endpoint or bucket.server.endpoint)


def checkpointer(tmp_path: Path, bucket: Any, attempt: int, **kwargs: Any) -> Checkpointer:
    kwargs.setdefault("job", "job-uid")
    return Checkpointer(
        tmp_path / f"staging-{attempt}", rank=0, world_size=1, object_store=config(bucket), attempt=attempt, **kwargs
    )


def state(step: int, size: int = 1000) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(step)
    return {"step": step, "weights": torch.randn(size, generator=generator), "epoch": 0}


def folder(step: int, attempt: int, *, job: str = "job-uid", rank: int = 0) -> str:
    """The payload folder of `step` written by `rank` of `attempt` of `job`."""
    return f"step-{step}-a{attempt}-r{rank}-{job_tag(job)}"


def store_of(bucket: Any) -> ObjectStore:
    return ObjectStore(config(bucket), job="reader", attempt=-1)


def paths(bucket: Any) -> list[str]:
    return sorted(meta["path"] for meta in obstore.list(store_of(bucket).store).collect())


def test_a_commit_resumes_bitwise_and_prune_keeps_the_newest(tmp_path: Path, s3_bucket: Any) -> None:
    first = checkpointer(tmp_path, s3_bucket, 0, keep=2)
    assert first.load() is None
    for step in (10, 20, 30):
        where = first.save(step, state(step))
        assert where == f"{s3_bucket.url}/{folder(step, 0)}"
    first.wait()
    assert [p for p in paths(s3_bucket) if not p.startswith(LOG_PREFIX)] == [
        f"{folder(20, 0)}/state.pt",
        f"{folder(30, 0)}/state.pt",
    ]
    assert not any((tmp_path / "staging-0" / ".staging").iterdir()), "staged copies go once uploaded"

    where, restored = checkpointer(tmp_path, s3_bucket, 1).load()  # type: ignore[misc]
    assert where == f"{s3_bucket.url}/{folder(30, 0)}"
    assert restored["step"] == 30 and torch.equal(restored["weights"], state(30)["weights"])


def test_the_checkpoint_record_comes_once_the_commit_landed(
    tmp_path: Path, s3_bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    saver = checkpointer(tmp_path, s3_bucket, 0, metrics=MetricsLogger(0, None))
    saver.load()
    saver.save(5, state(5), reason="signal")  # a stop save: committed when save returns
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    (record,) = [r for r in records if r["event"] == "checkpoint"]
    assert (record["step"], record["path"], record["reason"]) == (5, f"{s3_bucket.url}/{folder(5, 0)}", "signal")
    assert store_of(s3_bucket).latest().step == 5  # type: ignore[union-attr]


def test_a_stale_attempts_late_commit_is_refused_and_changes_nothing(
    tmp_path: Path, s3_bucket: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = checkpointer(tmp_path, s3_bucket, 0)
    stale.load()
    stale.save(10, state(10), wait=True)
    holder = checkpointer(tmp_path, s3_bucket, 1, metrics=MetricsLogger(0, None))
    where, _ = holder.load()  # type: ignore[misc]
    assert where.endswith(folder(10, 0))

    # The zombie of attempt 0 trained on and saves step 20 after attempt 1 took the store.
    with pytest.raises(
        CheckpointError, match="step 20 by attempt 0 was refused: attempt 1 of this job holds the store"
    ):
        stale.save(20, state(20), wait=True)
    assert store_of(s3_bucket).latest().step == 10  # type: ignore[union-attr]
    assert f"{folder(20, 0)}/state.pt" in paths(s3_bucket), "its bytes were uploaded; they never count"

    holder.save(12, state(12), wait=True)  # the holder's next commit prunes the stale bytes and reports
    assert f"{folder(20, 0)}/state.pt" not in paths(s3_bucket)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    (refused,) = [r for r in records if r["event"] == "checkpoint_refused"]
    assert (refused["refused_attempt"], refused["current_attempt"], refused["step"]) == (0, 1, 20)
    assert refused["path"] == f"{s3_bucket.url}/{folder(20, 0)}"
    where, restored = checkpointer(tmp_path, s3_bucket, 2).load()  # type: ignore[misc]
    assert where.endswith(folder(12, 1)) and restored["step"] == 12


def test_a_late_starter_of_an_old_attempt_cannot_take_the_store_back(tmp_path: Path, s3_bucket: Any) -> None:
    checkpointer(tmp_path, s3_bucket, 3).load()
    with pytest.raises(CheckpointError, match="attempt 3 of this job registered; attempt 2 is stale"):
        checkpointer(tmp_path, s3_bucket, 2).load()
    # Another job on the same location takes it over (it resumes what is there, like a volume's).
    checkpointer(tmp_path, s3_bucket, 3).save(7, state(7), wait=True)
    where, _ = checkpointer(tmp_path, s3_bucket, 0, job="a-new-job").load()  # type: ignore[misc]
    assert where.endswith(folder(7, 3))


def test_two_writers_racing_for_one_log_entry_get_one_order(tmp_path: Path, s3_bucket: Any) -> None:
    """Entry N is created once: the loser reads the log again, sees the newer attempt, is refused."""
    old, new = store_of(s3_bucket), store_of(s3_bucket)
    old.job = new.job = "job-uid"
    old.attempt, new.attempt = 0, 1
    old.register()
    old.read_log()  # old's view: it holds the store
    new.register()  # new appends entry 1 behind old's back
    with pytest.raises(Exception, match="refused"):
        old.commit(5, "step-5-a0/state.pt", 1, "0" * 64, {})
    entries = store_of(s3_bucket).read_log()
    assert [(e.seq, e.kind, e.attempt) for e in entries] == [(0, "attempt", 0), (1, "attempt", 1)]
    assert valid_commits(entries) == []


# Saves step 1 (committed), then a ~200 MB step 2, and is killed mid-upload or between its
# upload and its commit (the commit held back until the test kills the process).
KILLED_SAVER = textwrap.dedent(
    """
    import sys, time, torch
    from pathlib import Path
    from kubetrain.api.training import ObjectStoreConfig
    from kubetrain.trainer import objectstore
    from kubetrain.trainer.checkpoint import Checkpointer

    url, endpoint, staging, where = sys.argv[1:5]
    if where == "before-commit":
        upload = objectstore.ObjectStore.upload
        def upload_then_hold(self, step, state_file):
            done = upload(self, step, state_file)
            if step == 2:
                Path(staging, "uploaded").write_text("")
                time.sleep(600)
            return done
        objectstore.ObjectStore.upload = upload_then_hold
    ckpt = Checkpointer(staging, rank=0, world_size=1, object_store=ObjectStoreConfig(url=url, endpoint=endpoint),
                        job="job-uid", attempt=0)
    ckpt.load()
    ckpt.save(1, {"step": 1, "w": torch.ones(10)}, wait=True)
    ckpt.save(2, {"step": 2, "w": torch.randn(50_000_000)})
    time.sleep(600)
    """
)


@pytest.mark.parametrize("where", ["mid-upload", "before-commit"])
def test_a_kill_during_an_upload_resumes_the_previous_commit(tmp_path: Path, s3_bucket: Any, where: str) -> None:
    staging = tmp_path / "staging"
    env = {**os.environ, **s3_bucket.server.env()}
    args = [sys.executable, "-c", KILLED_SAVER, s3_bucket.url, s3_bucket.server.endpoint, str(staging), where]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Mid-upload: step 2 is staged (its meta.json is written last), its upload just started.
        marker = staging / ".staging" / "step-2" / "meta.json" if where == "mid-upload" else staging / "uploaded"
        wait_for(marker.exists, 120, f"the saver {where}", proc=proc, interval=0.02)
        if where == "mid-upload":
            time.sleep(0.2)  # 200 MB take seconds to upload here
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    store = store_of(s3_bucket)
    assert [e.step for e in valid_commits(store.read_log())] == [1], "killed before step 2's commit"
    if where == "before-commit":
        assert f"{folder(2, 0)}/state.pt" in paths(s3_bucket), "the payload was complete: only the commit was missing"
    where_resumed, restored = checkpointer(tmp_path, s3_bucket, 1).load()  # type: ignore[misc]
    assert where_resumed.endswith(folder(1, 0)) and restored["step"] == 1


def test_wrong_credentials_name_the_location_and_never_the_secret(
    tmp_path: Path, s3_bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "wrong-secret-" + os.urandom(6).hex()
    for name, value in s3_bucket.server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with pytest.raises(CheckpointError) as caught:
        checkpointer(tmp_path, s3_bucket, 0).load()
    message = str(caught.value)
    assert s3_bucket.url in message and s3_bucket.server.endpoint in message
    assert secret not in message and secret not in repr(caught.value.__cause__)


def test_an_unreachable_endpoint_fails_fast_at_load_and_an_upload_failure_lets_training_go_on(
    tmp_path: Path, s3_bucket: Any
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    ckpt = Checkpointer(tmp_path, rank=0, world_size=1, object_store=config(s3_bucket, dead), job="job-uid", attempt=0)
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=f"{s3_bucket.url} \\(endpoint {dead}\\)"):
        ckpt.load()
    assert time.monotonic() - started < 60, "a few quick retries, not a storm"
    # Mid-training the store goes away: a periodic save's failed upload is logged, the next save
    # goes on (training is never held by it), and a save that must be committed raises.
    ckpt.save(1, state(1))
    ckpt.save(2, state(2))
    with pytest.raises(CheckpointError, match=f"checkpoint store {s3_bucket.url} .* failed"):
        ckpt.save(3, state(3), reason="signal")


def test_an_entry_it_cannot_read_counts_for_nothing_and_is_never_overwritten(tmp_path: Path, s3_bucket: Any) -> None:
    store = store_of(s3_bucket)
    obstore.put(store.store, f"{LOG_PREFIX}000000000000.json", b"not json")
    checkpointer(tmp_path, s3_bucket, 0).save(3, state(3), wait=True)
    assert [(e.seq, e.kind) for e in store_of(s3_bucket).read_log()] == [(1, "attempt"), (2, "commit")]
    assert obstore.get(store.store, f"{LOG_PREFIX}000000000000.json").bytes().to_bytes() == b"not json"


def test_a_survivor_commits_its_step_alone_and_a_stale_one_is_refused(tmp_path: Path, s3_bucket: Any) -> None:
    """Rank 1 of attempt 4, whose peers are gone, saves alone (kubetrain.runtime.worker.survivor): its
    commit is the newest, with its own RNG state only. One of an older attempt is fenced out."""
    holder = checkpointer(tmp_path, s3_bucket, 4)
    holder.load()  # rank 0 of attempt 4 registered the attempt
    alone = Checkpointer(
        tmp_path / "rank1", rank=1, world_size=2, object_store=config(s3_bucket), job="job-uid", attempt=4
    )
    assert alone.save_alone(9, state(9), reason="peer_lost") == f"{s3_bucket.url}/{folder(9, 4, rank=1)}"
    assert not any((tmp_path / "rank1" / ".staging").iterdir()), "the staged copy goes once committed"
    stale = Checkpointer(
        tmp_path / "old", rank=1, world_size=2, object_store=config(s3_bucket), job="job-uid", attempt=3
    )
    with pytest.raises(CheckpointError, match="step 11 by attempt 3 was refused"):
        stale.save_alone(11, state(11), reason="peer_lost")

    reader = checkpointer(tmp_path, s3_bucket, 5, resizable=True)
    where, restored = reader.load()  # type: ignore[misc]
    assert where.endswith(folder(9, 4, rank=1)) and torch.equal(restored["weights"], state(9)["weights"])
    assert reader.loaded_reason == "peer_lost"
