"""runPolicy.failurePolicy and hangTimeoutSeconds through `kubetrain run --local`, with real
processes: the operator's decision applies them to the local gang exactly as on a cluster."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.jobs import fake_job, write_job
from support.local_runs import KUBETRAIN, finish_run, run_status, summary

from kubetrain.api.models import TrainingJobStatus
from kubetrain.operator.conditions import get_condition

pytestmark = pytest.mark.unit


def run(job: dict[str, Any], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], TrainingJobStatus]:
    done = finish_run(write_job(tmp_path, job), tmp_path / "run")
    return done, run_status(tmp_path / "run")


def test_a_fail_job_rule_on_exit_code_2_fails_at_once(tmp_path: Path) -> None:
    # Node 1 exits 2 (a bad config, say); node 0 would run for a minute.
    script = "import os, sys, time\nif os.environ['NODE_RANK'] == '1': sys.exit(2)\ntime.sleep(60)"
    policy = {
        "maxRestarts": 3,
        "failurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2]}}]},
    }
    done, status = run(fake_job(script, runPolicy=policy), tmp_path)
    assert done.returncode == 1, done.stdout
    failed = get_condition(status, "Failed")
    assert failed is not None and failed.reason == "FailurePolicy", status
    assert "failurePolicy.rules[0] (FailJob on exit code 2)" in failed.message
    assert (status.attempt, status.restarts) == (0, 0), "no restart"
    result = summary(tmp_path / "run")
    assert (result["reason"], result["attempts"], result["restarts"]) == ("FailurePolicy", 1, 0)
    assert done.stdout.rstrip().splitlines()[-1].startswith("node 1 failed with exit code 2 in attempt 0")


# Rank 0 logs 3 steps; in the first attempt it then hangs (alive, no progress: a stuck DataLoader).
# Rank 1 waits for rank 0 of its own attempt (MASTER_PORT is new each attempt) to finish.
HANGS_ONCE = textwrap.dedent(
    """
    import json, os, pathlib, time
    marker = pathlib.Path({marker!r})
    done = marker.with_name("done-" + os.environ["MASTER_PORT"])
    if os.environ["NODE_RANK"] == "0":
        for step in range(1, 4):
            print(json.dumps({{"event": "step", "time": time.time(), "step": step, "total_steps": 3}}), flush=True)
        if not marker.exists():
            marker.touch()
            time.sleep(300)
        done.touch()
    else:
        while not done.exists():
            time.sleep(0.1)
    """
)


def test_a_hung_gang_goes_stalled_and_restarts(tmp_path: Path) -> None:
    script = HANGS_ONCE.format(marker=str(tmp_path / "hung-once"))
    done, status = run(fake_job(script, runPolicy={"maxRestarts": 1, "hangTimeoutSeconds": 3}), tmp_path)
    assert done.returncode == 0, done.stdout
    assert (status.phase, status.attempt, status.restarts) == ("Succeeded", 1, 1)
    (failure,) = status.failures or []
    # Not under torchrun: no rank's stacks, so the culprit is unknown (rank 0 only reported it).
    assert (failure.attempt, failure.rank, failure.reason) == (0, None, "Stalled")
    assert "reported no progress for hangTimeoutSeconds=3" in failure.message
    assert "culprit unknown: no rank wrote its stacks" in failure.message
    # The restarted gang logged its steps: Stalled went False, however fast the restart was.
    stalled = get_condition(status, "Stalled")
    assert stalled is not None and (stalled.status, stalled.reason) == ("False", "ProgressResumed"), stalled
    assert f"Stalled: {failure.message}" in done.stdout


# Rank 0 saves its final checkpoint, records `done` and exits 0; only once it is gone (reaped by
# the supervisor, which folds its output then) does node 1 abort, as gloo's threads may at
# interpreter exit (issue 13's SIGABRT after a finished run).
LATE_CRASH = textwrap.dedent(
    """
    import json, os, pathlib, time
    flag = pathlib.Path({flag!r}).with_name("rank0-" + os.environ["MASTER_PORT"])
    if os.environ["NODE_RANK"] == "0":
        now = time.time()
        print(json.dumps({{"event": "checkpoint", "time": now, "step": 10, "path": "/ckpt/step-10"}}))
        print(json.dumps({{"event": "done", "time": now, "step": 10, "total_steps": 10}}), flush=True)
        flag.write_text(str(os.getpid()))
    else:
        while not flag.exists() or pathlib.Path("/proc", flag.read_text()).exists():
            time.sleep(0.05)
        os.abort()
    """
)


def test_a_crash_after_the_final_checkpoint_and_done_does_not_rerun_the_job(tmp_path: Path) -> None:
    script = LATE_CRASH.format(flag=str(tmp_path / "flag"))
    done, status = run(fake_job(script, runPolicy={"maxRestarts": 3}), tmp_path)
    assert done.returncode == 0, done.stdout
    succeeded = get_condition(status, "Succeeded")
    assert succeeded is not None and succeeded.reason == "CompletedBeforeFailure", status
    assert "checkpoint /ckpt/step-10 holds step 10" in succeeded.message
    assert "node 1 (pod fake-node-1) failed with exit code 134" in succeeded.message
    assert (status.attempt, status.restarts) == (0, 0)
    assert summary(tmp_path / "run")["nodeExitCodes"] == [0, -6]


# Rank 0 records its final checkpoint and `done`, then exits 0; rank 1 never exits (a teardown
# that hangs forever). The pid file lets the test check that the straggler's process is gone.
STRAGGLER = textwrap.dedent(
    """
    import json, os, pathlib, time
    if os.environ["NODE_RANK"] == "0":
        now = time.time()
        print(json.dumps({{"event": "checkpoint", "time": now, "step": 10, "path": "/ckpt/step-10"}}))
        print(json.dumps({{"event": "done", "time": now, "step": 10, "total_steps": 10}}), flush=True)
    else:
        pathlib.Path({pid!r}).write_text(str(os.getpid()))
        while True:
            time.sleep(3600)
    """
)


def test_a_rank_that_never_exits_after_done_is_stopped_and_the_job_succeeds(tmp_path: Path) -> None:
    pid_file = tmp_path / "straggler.pid"
    job_file = write_job(tmp_path, fake_job(STRAGGLER.format(pid=str(pid_file)), runPolicy={"maxRestarts": 3}))
    done = subprocess.run(
        [KUBETRAIN, "run", str(job_file), "--local", "--run-dir", str(tmp_path / "run"), "--straggler-timeout", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    status = run_status(tmp_path / "run")
    succeeded = get_condition(status, "Succeeded")
    assert succeeded is not None and succeeded.reason == "CompletedWithStragglers", status
    assert "node 1 (pod fake-node-1) still running 3 s after done; its pod deleted" in succeeded.message
    assert (status.attempt, status.restarts, status.failures) == (0, 0, None)
    assert "Straggler: node 1 (pod fake-node-1)" in done.stdout
    assert not psutil.pid_exists(int(pid_file.read_text())), "the straggler's process is gone"
