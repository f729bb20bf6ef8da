"""A bring-your-own script through `kubetrain run --local`: its snapshots land in the run dir
through KUBETRAIN_CHECKPOINT_DIR, so a new run dir starts fresh instead of resuming another run."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.jobs import ROOT, training_job, write_job
from support.local_runs import records, run_cli, summary

pytestmark = [pytest.mark.unit, pytest.mark.slow]


def test_each_run_dir_keeps_its_own_snapshots(tmp_path: Path) -> None:
    job = training_job(ROOT / "examples" / "byo-script.yaml")
    job["spec"]["args"] = ["--epochs", "1"]
    job_file = write_job(tmp_path, job)
    for run in ("first", "second"):
        # One node is enough to show where its snapshots go, at half the processes of two.
        done = run_cli("run", str(job_file), "--local", "--nodes", "1", "--run-dir", str(tmp_path / run), timeout=240)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        (start,) = [r for r in records(tmp_path / run) if r["event"] == "start"]
        assert start["resumed_from"] is None, f"{run} resumed another run's snapshot"
        snapshots = summary(tmp_path / run)["checkpointsWritten"]
        assert snapshots and all(Path(p).parent == (tmp_path / run / "checkpoints").resolve() for p in snapshots)
    assert not (ROOT / "checkpoints").exists()
