"""A bring-your-own script through `kubetrain run --local`: its snapshots land in the run dir
through KUBETRAIN_CHECKPOINT_DIR, so a new run dir starts fresh instead of resuming another run;
and the bring-your-own-data example reads its dataset from a volume mapped to a local folder."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.jobs import BYO_DATA, ROOT, training_job, write_job
from support.local_runs import records, run_cli, start_run, summary
from support.waiting import wait_for

pytestmark = pytest.mark.train


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


def test_a_script_using_the_library_stop_saves_the_step_it_stopped_at(tmp_path: Path) -> None:
    """examples/byo_train.py with lib.StopSignal: Ctrl-C mid-run saves the current step (reason
    signal) on every rank's agreement, and the rerun of the run dir starts exactly there."""
    job = training_job(ROOT / "examples" / "byo-script.yaml")
    job["spec"]["args"] = ["--epochs", "200"]
    job_file = write_job(tmp_path, job)
    run_dir = tmp_path / "run"
    proc = start_run(job_file, run_dir)
    wait_for(lambda: any(r["event"] == "eval" for r in records(run_dir)), 240, "the first epoch's eval", proc=proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-4000:]
    (saved,) = [r for r in records(run_dir) if r.get("reason") == "signal"]
    assert saved["step"] > 22, "stopped in the second epoch or later, mid-epoch"

    job["spec"]["args"] = ["--epochs", "3"]
    write_job(tmp_path, job)
    done = run_cli("run", str(job_file), "--local", "--run-dir", str(run_dir), timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    starts = [r for r in records(run_dir) if r["event"] == "start"]
    assert starts[-1]["step"] == saved["step"] and starts[-1]["resumed_from"] == saved["path"], "0 steps lost"


def test_byo_data_example_reads_its_dataset_from_the_volume(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    writer = [sys.executable, str(ROOT / "examples" / "byo_data_train.py"), "--write-dataset", str(dataset)]
    subprocess.run(writer, check=True, capture_output=True, timeout=120)
    run_dir = tmp_path / "run"
    # One node reads the mapped volume as any would, at half the processes of the example's two.
    done = run_cli(
        "run",
        str(BYO_DATA),
        "--local",
        "--nodes",
        "1",
        "--volume",
        f"dataset={dataset}",
        "--run-dir",
        str(run_dir),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    mounts = json.loads((run_dir / "local-volumes.json").read_text())["mounts"]
    assert mounts == [{"mountPath": "/data", "volume": "dataset", "local": str(dataset.resolve())}]
    start = next(r for r in records(run_dir) if r["event"] == "start")
    assert start["data"] == str(dataset.resolve() / "digits.csv") and start["samples"] == 1797
    assert any(r["event"] == "done" for r in records(run_dir))
