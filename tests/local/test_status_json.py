"""A local run's status.json is the cluster's `.status`: written by the operator's own decision,
validated by the same model, with rank 0's records folded in by the same fold."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.jobs import fake_job, write_job
from support.local_runs import finish_run, run_status, summary

from kubetrain.api.models import TrainingJobStatus
from kubetrain.api.records import fold
from kubetrain.operator.conditions import get_condition

pytestmark = pytest.mark.unit

RECORDS = [
    {"event": "start", "time": 1_800_000_000, "step": 0, "epoch": 0, "total_steps": 10},
    {"event": "step", "time": 1_800_000_001, "step": 5, "epoch": 0, "total_steps": 10, "loss": 0.5},
    {"event": "checkpoint", "time": 1_800_000_002, "step": 5, "epoch": 0, "path": "/ckpt/step-5"},
    {"event": "eval", "time": 1_800_000_003, "step": 10, "epoch": 1, "accuracy": 0.75},
    {"event": "done", "time": 1_800_000_004, "step": 10, "epoch": 1, "loss": 0.25, "accuracy": 0.75},
]


def run(job: dict[str, Any], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], TrainingJobStatus]:
    done = finish_run(write_job(tmp_path, job), tmp_path / "run")
    return done, run_status(tmp_path / "run")


def test_rank_0_records_are_folded_as_the_operator_folds_them(tmp_path: Path) -> None:
    lines = "\n".join(json.dumps(record) for record in RECORDS)
    script = textwrap.dedent(
        f"""
        import os
        if os.environ['NODE_RANK'] == '0':
            print('a log line between the records')
            print({lines!r}, flush=True)
        """
    )
    done, status = run(fake_job(script), tmp_path)
    assert done.returncode == 0, done.stdout
    progress, checkpoint = fold(lines)
    assert (status.progress, status.last_checkpoint) == (progress, checkpoint)
    succeeded = get_condition(status, "Succeeded")
    assert status.phase == "Succeeded" and succeeded is not None and succeeded.reason == "AllNodesSucceeded"
    result = summary(tmp_path / "run")
    # The done record carries the final loss (0.25), newer than the last step record's.
    assert (result["finalStep"], result["finalLoss"], result["finalAccuracy"]) == (10, 0.25, 0.75)
    assert result["checkpointsWritten"] == ["/ckpt/step-5"]
    assert result["lastCheckpoint"] == {"path": "/ckpt/step-5", "step": 5, "time": "2027-01-15T08:00:02Z"}
    assert "checkpoints   1 written, last /ckpt/step-5" in done.stdout


def test_a_failed_run_has_the_cluster_status_and_names_the_failing_node(tmp_path: Path) -> None:
    script = (
        "import os, sys, time\nif os.environ['NODE_RANK'] == '1':\n    print('bad config'); sys.exit(3)\ntime.sleep(60)"
    )
    done, status = run(fake_job(script, runPolicy={"maxRestarts": 1}), tmp_path)
    assert done.returncode == 1, done.stdout
    assert (status.phase, status.attempt, status.restarts) == ("Failed", 1, 1)
    failed = get_condition(status, "Failed")
    assert failed is not None and failed.reason == "BackoffLimitExceeded"
    assert "node 1 (pod fake-node-1) failed with exit code 3 (Error): bad config" in failed.message
    assert [(f.attempt, f.rank, f.exit_code, f.message) for f in status.failures or []] == [
        (0, 1, 3, "bad config"),
        (1, 1, 3, "bad config"),
    ]
    # The operator's next pass after its cleanup: the stopped node is no longer counted.
    assert status.replicas is not None and (status.replicas.active, status.replicas.failed) == (0, 1)
    assert summary(tmp_path / "run")["failures"] == [f.wire() for f in status.failures or []]
    # The honest summary of a job that logs no checkpoint records, and the last line names the node.
    assert "checkpoints   none reported (the job logged no checkpoint records)" in done.stdout
    assert "resuming from the last checkpoint" not in done.stdout
    assert "kubetrain saw no checkpoint record" in done.stdout
    # Each attempt's output on its own, as a cluster's log archive keeps it (docs/logs.md); the
    # node's log of the whole run holds both.
    log = tmp_path / "run" / "attempts" / "1" / "node-1.log"
    assert done.stdout.rstrip().splitlines()[-1] == (
        f"node 1 failed with exit code 3 in attempt 1 (Error); its log: {log}"
    )
    assert log.read_text().count("bad config") == 1
    assert (tmp_path / "run" / "attempts" / "0" / "node-1.log").read_text().count("bad config") == 1
    assert (tmp_path / "run" / "node-1.log").read_text().count("bad config") == 2


def test_a_refused_or_skipped_checkpoint_is_one_warning_line_and_in_status_json(tmp_path: Path) -> None:
    """As the operator posts one CheckpointRefused Event: the holder's rank 0 may report the same
    refusal again (a resumed holder), the run shows it once. So is a commit a resume skipped."""
    refused = {
        "event": "checkpoint_refused",
        "time": 1_800_000_005,
        "step": 40,
        "epoch": 0,
        "path": "s3://bucket/runs/a/step-40",
        "attempt": 1,
        "refused_attempt": 0,
        "current_attempt": 1,
    }
    skipped = {
        "event": "checkpoint_skipped",
        "time": 1_800_000_006,
        "step": 30,
        "epoch": 0,
        "path": "s3://bucket/runs/a/step-30-a0-r0-0123abcd",
        "why": "its payload is missing",
        "attempt": 1,
    }
    lines = "\n".join([json.dumps(r) for r in (RECORDS[1], refused, refused, skipped, skipped)])
    script = f"import os\nif os.environ['NODE_RANK'] == '0':\n    print({lines!r}, flush=True)"
    done, status = run(fake_job(script), tmp_path)
    assert done.returncode == 0, done.stdout
    warning = (
        "[kubetrain] CheckpointRefused: attempt 0's checkpoint of step 40 (s3://bucket/runs/a/step-40) was "
        "refused: attempt 1 holds the object store, and a stale attempt's commit never overwrites it"
    )
    assert done.stdout.count("CheckpointRefused") == 1 and warning in done.stdout.splitlines(), done.stdout
    assert status.last_checkpoint_refusal is not None and status.last_checkpoint_refusal.step == 40
    assert done.stdout.count("CheckpointSkipped") == 1, done.stdout
    assert status.last_checkpoint_skipped is not None and status.last_checkpoint_skipped.step == 30
    assert status.progress is not None and status.progress.step == 5, "the refusal moved no progress"
