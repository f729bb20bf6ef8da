"""`kubetrain run --local` with checkpoints on a real S3 server (SeaweedFS): the same YAML a
cluster runs, no volume between attempts, every guarantee of a volume kept."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import obstore
import psutil
import pytest
import torch
from support.jobs import digits_job, write_job
from support.local_runs import records, run_status, start_run, summary
from support.waiting import wait_for

from kubetrain.api.training import ObjectStoreConfig
from kubetrain.trainer.objectstore import ObjectStore

pytestmark = pytest.mark.train


def object_store_job(bucket: Any, **training: Any) -> dict[str, Any]:
    job = digits_job(**training)
    job["spec"]["checkpoint"]["objectStore"] = {"url": bucket.url, "endpoint": bucket.server.endpoint}
    return job


@pytest.fixture
def credentials(s3_bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kubetrain run` and its nodes take the credentials from this environment."""
    for name, value in s3_bucket.server.env().items():
        monkeypatch.setenv(name, value)


def reader(bucket: Any) -> ObjectStore:
    return ObjectStore(ObjectStoreConfig(url=bucket.url, endpoint=bucket.server.endpoint), job="reader", attempt=-1)


def newest_in_store(bucket: Any, tmp_path: Path) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(step, saved payload, meta) of the store's newest commit."""
    store = reader(bucket)
    entry = store.latest()
    assert entry is not None and entry.step is not None, "the store holds no commit"
    local = store.download(entry, tmp_path / f"newest-{entry.step}.pt")
    return entry.step, torch.load(local, weights_only=False), entry.meta


def reference_weights(tmp_path: Path, job: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The final weights of `job` run undisturbed on a volume (the store changes no weight)."""
    plain = json.loads(json.dumps(job))
    del plain["spec"]["checkpoint"]["objectStore"]
    plain["spec"].pop("env", None)
    run = start_run(write_job(tmp_path, plain, "reference.yaml"), tmp_path / "reference")
    out, _ = run.communicate(timeout=300)
    assert run.returncode == 0, out[-4000:]
    steps = sorted((tmp_path / "reference" / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    model: dict[str, torch.Tensor] = torch.load(steps[-1] / "state.pt", weights_only=False)["state"]["model"]
    return model


def assert_same_weights(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(tensor, got[name]), f"{name} differs from the undisturbed run"


def test_random_sigkills_of_ranks_end_with_the_undisturbed_runs_weights(
    tmp_path: Path, s3_bucket: Any, credentials: None
) -> None:
    seed = random.randrange(1_000_000)
    chooser = random.Random(seed)
    job = object_store_job(s3_bucket, epochs=4, logEverySteps=1)
    job["spec"]["checkpoint"]["everySteps"] = 7
    job["spec"]["runPolicy"] = {"maxRestarts": 5}
    expected = reference_weights(tmp_path, job)
    # First kill: a random rank SIGKILLs itself at a random step (the fault marker is local, so it
    # fires once); second: the test SIGKILLs a random worker at a random step of the next attempt.
    fault_rank, fault_step, second_after = chooser.randrange(2), chooser.randrange(8, 40), chooser.randrange(3, 20)
    job["spec"]["env"] = [{"name": "KUBETRAIN_FAULT", "value": f"kill,rank={fault_rank},step={fault_step}"}]
    print(f"seed {seed}: rank {fault_rank} killed at step {fault_step}, a worker {second_after} steps into attempt 1")

    run_dir = tmp_path / "killed"
    proc = start_run(write_job(tmp_path, job), run_dir)

    def steps_of_attempt(attempt: int) -> list[int]:
        return [r["step"] for r in records(run_dir) if r["event"] == "step" and r.get("attempt") == attempt]

    wait_for(lambda: len(steps_of_attempt(1)) >= second_after, 300, "attempt 1 training", proc=proc)
    pids = json.loads((run_dir / "pids.json").read_text())["pids"]
    workers = [c for c in psutil.Process(chooser.choice(pids)).children(recursive=True) if "python" in c.name()]
    if workers:
        chooser.choice(workers).send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-4000:]

    result = summary(run_dir)
    assert result["restarts"] >= 2 if workers else result["restarts"] >= 1
    resumes = [r for r in records(run_dir) if r["event"] == "resume"]
    assert resumes and all(r["path"].startswith(s3_bucket.url + "/step-") for r in resumes)
    step, saved, meta = newest_in_store(s3_bucket, tmp_path)
    assert meta["reason"] in ("final", "epoch") and step == records(run_dir)[-1]["total_steps"]
    assert_same_weights(expected, saved["state"]["model"])
    # One folder per writer: step, attempt, rank and the job's tag (trainer/objectstore.py).
    newest = run_status(run_dir).last_checkpoint.path  # type: ignore[union-attr]
    assert newest.startswith(f"{s3_bucket.url}/step-{step}-a{result['attempts'] - 1}-r"), newest


# Periodic saves off; from step 30 rank 0 takes 0.3 s a step, so the run cannot end before the
# test's SIGINT (as tests/local/test_training.py's Ctrl-C test).
STOP_JOB = {"epochs": 4, "logEverySteps": 1, "numWorkers": 2}
SLOW = "slow,rank=0,step=30,ms=300"


def test_ctrl_c_commits_the_stop_checkpoint_to_the_store_and_a_rerun_loses_none(
    tmp_path: Path, s3_bucket: Any, credentials: None
) -> None:
    job = object_store_job(s3_bucket, **STOP_JOB)
    job["spec"]["checkpoint"]["everySteps"] = 1_000_000
    expected = reference_weights(tmp_path, job)
    job["spec"]["env"] = [{"name": "KUBETRAIN_FAULT", "value": SLOW}]
    job_file = write_job(tmp_path, job)

    run_dir = tmp_path / "stopped"
    proc = start_run(job_file, run_dir)
    wait_for((run_dir / "checkpoints" / ".faults" / "slow-rank0-step30").exists, 240, "rank 0 slowed", proc=proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-4000:]
    reached = max(r["step"] for r in records(run_dir) if r["event"] == "step")
    step, _, meta = newest_in_store(s3_bucket, tmp_path)
    assert (step, meta["reason"]) == (reached, "signal"), "the store holds the stop checkpoint of the last step"
    assert run_status(run_dir).last_checkpoint.path.startswith(s3_bucket.url)  # type: ignore[union-attr]
    assert not list((run_dir / "checkpoints").glob("step-*")), "nothing but staging on the local disk"

    again = start_run(job_file, run_dir)  # the same run dir and store: it resumes
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out[-4000:]
    resumed = [r for r in records(run_dir) if r["event"] == "resume"]
    assert [r["step"] for r in resumed] == [reached], "0 steps lost"
    _, saved, _ = newest_in_store(s3_bucket, tmp_path)
    assert_same_weights(expected, saved["state"]["model"])


def test_wrong_credentials_fail_the_job_at_once_clearly_and_print_no_secret(
    tmp_path: Path, s3_bucket: Any, credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "not-the-secret-" + os.urandom(8).hex()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    job = object_store_job(s3_bucket, epochs=1)
    job["spec"]["runPolicy"] = {"maxRestarts": 1}
    run_dir = tmp_path / "run"
    proc = start_run(write_job(tmp_path, job), run_dir)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert not [r for r in records(run_dir) if r["event"] == "step"], "it failed before training: no step to lose"
    node0 = (run_dir / "node-0.log").read_text()
    assert f"checkpoint store {s3_bucket.url} (endpoint {s3_bucket.server.endpoint})" in node0
    status = run_status(run_dir)
    assert status.restarts == 0, "no retry can cure a refused credential: the job fails at once"
    failure = status.failures[0]  # type: ignore[index]
    assert failure.reason == "CheckpointStoreDenied", failure
    # The cause first, the store named, one sentence: no traceback, no client debug dump.
    assert failure.message.startswith(f"checkpoint store {s3_bucket.url}"), failure.message
    assert "SignatureDoesNotMatch" in failure.message and "Traceback" not in failure.message, failure.message
    assert len(failure.message) < 600 and "Debug source" not in failure.message, failure.message
    leaks = [str(p) for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert secret not in out and not leaks, f"the secret was printed: {leaks}"
    assert obstore.list(s3_bucket.store(), prefix=s3_bucket.prefix).collect() == [], "nothing written"
