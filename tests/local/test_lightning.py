"""A Lightning script as its users write it (tests/support/workloads/lightning_train.py: DDP on 2
nodes, ModelCheckpoint, a resume from last.ckpt), unchanged, through `kubetrain run --local`: its
progress and checkpoints reach the status, and Ctrl-C stops every node in seconds at one step that
Lightning saved, which a rerun resumes (kubetrain.runtime.guest.lightning_adapter)."""

from __future__ import annotations

import inspect
import re
import signal
from pathlib import Path

import pytest
import torch
from support.jobs import bare_job, write_job
from support.local_runs import finish_run, records, run_status, start_run, summary
from support.waiting import wait_for
from support.workloads import lightning_train

pytestmark = pytest.mark.train

SCRIPT = str(Path(inspect.getfile(lightning_train)))
# Ctrl-C to the nodes' exit; without kubetrain Lightning could hold its ranks until torchrun's 120 s.
STOPPED_WITHIN_S = 10.0


def lightning_job(max_steps: int) -> dict[str, object]:
    return bare_job("lit", nodes=2, command=["torchrun", SCRIPT, str(max_steps)])


def test_a_lightning_run_reports_its_progress_and_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = finish_run(write_job(tmp_path, lightning_job(60)), run_dir, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:]
    status = run_status(run_dir)
    assert status.progress is not None and (status.progress.step, status.progress.total_steps) == (60, 60)
    assert status.progress.loss is not None and status.progress.done_at is not None
    assert status.last_checkpoint is not None and status.last_checkpoint.step == 60
    assert status.last_checkpoint.path == str((run_dir / "checkpoints" / "last.ckpt").resolve())
    metrics = records(run_dir)
    assert [r["event"] for r in metrics][:2] == ["start", "step"] and metrics[-1]["event"] == "done"
    saved = {r["step"] for r in metrics if r["event"] == "checkpoint"}
    assert saved == {20, 40, 60}, "every_n_train_steps=20, each recorded once written"
    assert summary(run_dir)["finalStep"] == 60 and (run_dir / "metrics.png").exists()


def test_ctrl_c_stops_every_node_in_seconds_and_a_rerun_loses_no_step(tmp_path: Path) -> None:
    # A million steps: the run cannot end before the Ctrl-C, which comes once a periodic checkpoint exists.
    job_file = write_job(tmp_path, lightning_job(1_000_000))
    run_dir = tmp_path / "run"
    proc = start_run(job_file, run_dir)
    first_save = lambda: any(r["event"] == "checkpoint" for r in records(run_dir))  # noqa: E731
    wait_for(first_save, 240, "the first periodic checkpoint", proc=proc)
    reached = max(r["step"] for r in records(run_dir) if r["event"] in ("step", "checkpoint"))
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 130, out[-4000:]
    stopped = re.search(r"stopped 2 running node\(s\) in ([0-9.]+)s", out)
    assert stopped is not None and float(stopped.group(1)) < STOPPED_WITHIN_S, out[-4000:]

    (saved,) = [r for r in records(run_dir) if r["event"] == "checkpoint" and r.get("reason") == "signal"]
    stop_step = saved["step"]
    assert saved["path"] == str((run_dir / "checkpoints" / "last.ckpt").resolve()) and stop_step >= reached
    trained = max(r["step"] for r in records(run_dir) if r["event"] == "step")
    assert trained == stop_step, "the stop saved the last step trained, and no rank trained past it"
    checkpoint = torch.load(saved["path"], map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == stop_step, "Lightning's own checkpoint of that step"
    assert run_status(run_dir).last_checkpoint.reason == "signal"  # type: ignore[union-attr]
    for node in (0, 1):
        log = (run_dir / f"node-{node}.log").read_text()
        assert f"checkpoint of step {stop_step} written to" in log and "exiting 143" in log, f"node {node}"
        assert "Received SIGTERM" not in log, "Lightning's own handler did not run"

    write_job(tmp_path, lightning_job(stop_step + 10))
    again = start_run(job_file, run_dir)
    out, _ = again.communicate(timeout=240)
    assert again.returncode == 0, out[-4000:]
    resumed = [r for r in records(run_dir) if r["event"] == "resume"]
    assert [(r["step"], r["reason"]) for r in resumed] == [(stop_step, "signal")], "0 steps lost"
    assert run_status(run_dir).progress.step == stop_step + 10  # type: ignore[union-attr]
