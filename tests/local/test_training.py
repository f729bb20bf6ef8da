"""Real 2-node gloo training through `kubetrain run --local` (torch on CPU)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from support.jobs import DIGITS_CPU, digits_job, write_job
from support.local_runs import alive, final_state, records, run_cli, run_status, start_run, summary
from support.waiting import wait_for

pytestmark = pytest.mark.train


def test_readme_first_command_trains_the_cpu_example(tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    shutil.copy(DIGITS_CPU, tmp_path / "examples")
    done = run_cli("run", "examples/digits-cpu.yaml", "--local", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (run_dir,) = (tmp_path / "runs").glob("digits-cpu-*")
    result = summary(run_dir)
    assert result["outcome"] == "Succeeded" and result["restarts"] == 0
    assert result["nodeExitCodes"] == [0, 0]
    metrics = records(run_dir)
    (start,) = [r for r in metrics if r["event"] == "start"]
    assert (start["world_size"], start["backend"]) == (2, "gloo")
    evals = [r for r in metrics if r["event"] == "eval"]
    assert evals[-1]["accuracy"] >= 0.9
    assert result["finalAccuracy"] == metrics[-1]["accuracy"] >= 0.9
    # The final checkpoint gathered RNG and loader states from both ranks (a world of two to the end).
    state = final_state(run_dir)
    assert len(state["ranks"]) == 2 and state["state"]["step"] == start["total_steps"]
    assert (run_dir / "node-0.log").exists() and (run_dir / "node-1.log").exists()
    assert (run_dir / "metrics.png").stat().st_size > 10_000
    assert "Succeeded" in done.stdout and f"run dir       {Path('runs') / run_dir.name}" in done.stdout


# Node 1 hangs at step 25, after the first checkpoints (step 20; 22, the epoch end), by KUBETRAIN_FAULT: the kill
# comes while the run is held there, so it can never race a run that already finished.
KILL_JOB = {"epochs": 20, "maxSteps": 600, "logEverySteps": 5}
HOLD = "hang,rank=1,step=25"


def reference_and_faulted(tmp_path: Path, job: dict[str, Any], fault: str) -> Path:
    """Run `job` to its end as the reference (tmp_path/reference); return its file with
    KUBETRAIN_FAULT set (the fault changes timing only, never the weights)."""
    reference = start_run(write_job(tmp_path, job), tmp_path / "reference")
    out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out[-4000:]
    faulted = copy.deepcopy(job)
    faulted["spec"]["env"] = [{"name": "KUBETRAIN_FAULT", "value": fault}]
    return write_job(tmp_path, faulted, "faulted.yaml")


def assert_same_weights_as_the_reference(tmp_path: Path, run_dir: Path) -> int:
    """The final checkpoint of `run_dir` is bitwise the reference's; returns its step."""
    expected, got = final_state(tmp_path / "reference")["state"], final_state(run_dir)["state"]
    assert got["step"] == expected["step"] and expected["model"].keys() == got["model"].keys()
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, got["model"][name]), f"{name} differs from the uninterrupted run"
    return int(got["step"])


def test_killing_a_node_restarts_the_gang_and_ends_with_the_same_weights(tmp_path: Path) -> None:
    job = digits_job(**KILL_JOB)
    job["spec"]["checkpoint"]["everySteps"] = 20
    held_file = reference_and_faulted(tmp_path, job, HOLD)

    run_dir = tmp_path / "killed"
    proc = start_run(held_file, run_dir)
    marker = run_dir / "checkpoints" / ".faults" / "hang-rank1-step25"
    wait_for(marker.exists, 240, "node 1 held at step 25", proc=proc)
    assert any(r["event"] == "checkpoint" and r["step"] == 20 for r in records(run_dir))
    total = records(run_dir)[-1]["total_steps"]
    os.kill(json.loads((run_dir / "pids.json").read_text())["pids"][1], signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]

    result = summary(run_dir)
    assert (result["restarts"], result["attempts"], result["failures"][0]["rank"]) == (1, 2, 1)
    metrics = records(run_dir)
    second = next(i for i, r in enumerate(metrics) if r["event"] == "start" and i > 0)
    first_attempt_steps = [r["step"] for r in metrics[:second]]
    assert metrics[0]["resumed_from"] is None and metrics[second]["resumed_from"]
    resumed = int(Path(metrics[second]["resumed_from"]).name.split("-")[1])
    saved = max(r["step"] for r in metrics[:second] if r["event"] == "checkpoint")
    assert resumed == saved and max(first_attempt_steps) <= 25 < total, "killed while held, resumed from its last save"

    assert assert_same_weights_as_the_reference(tmp_path, run_dir) == total


def test_sigint_mid_training_leaves_no_process(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, digits_job(epochs=200))
    run_dir = tmp_path / "run"
    proc = start_run(job_file, run_dir)
    wait_for(
        lambda: next((r for r in records(run_dir) if r["event"] == "step"), None), 240, "the first step", proc=proc
    )
    tree = psutil.Process(proc.pid).children(recursive=True)
    assert len(tree) >= 4, "torchrun and one worker per node"
    seen = [(p.pid, p.create_time()) for p in tree]
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-4000:]
    assert not [pid for pid, created in seen if alive(pid, created)]
    assert summary(run_dir)["outcome"] == "Interrupted"


# Periodic saves off: only epoch ends (every 22 steps) and the stop save a step when asked.
# From step 30 on rank 0 takes 0.3 s a step (KUBETRAIN_FAULT slow): the run cannot end before
# the test's SIGINT, by construction. DataLoader worker processes, as examples/cnn-gpu.yaml has:
# the stop signal reaches them too (torchrun signals each rank's process group).
STOP_JOB = {"epochs": 4, "logEverySteps": 1, "numWorkers": 2}
SLOW = "slow,rank=0,step=30,ms=300"


def test_ctrl_c_checkpoints_the_current_step_and_a_rerun_loses_none(tmp_path: Path) -> None:
    job = digits_job(**STOP_JOB)
    job["spec"]["checkpoint"]["everySteps"] = 1_000_000
    slow_file = reference_and_faulted(tmp_path, job, SLOW)

    run_dir = tmp_path / "stopped"
    proc = start_run(slow_file, run_dir)
    wait_for((run_dir / "checkpoints" / ".faults" / "slow-rank0-step30").exists, 240, "rank 0 slowed", proc=proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)  # well within the pods' 120 s grace: no SIGKILL needed
    assert proc.returncode == 130, out[-4000:]
    first = records(run_dir)
    reached = max(r["step"] for r in first if r["event"] == "step")
    (saved,) = [r for r in first if r["event"] == "checkpoint" and r.get("reason") == "signal"]
    assert saved["step"] == reached > 30, "the stop saved the last step trained, and nothing ran after it"
    assert run_status(run_dir).last_checkpoint.reason == "signal"  # type: ignore[union-attr]
    assert "exiting 143" in (run_dir / "node-0.log").read_text()

    again = start_run(slow_file, run_dir)  # the same run dir: it resumes (the fault fired already)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out[-4000:]
    resumed = [r for r in records(run_dir) if r["event"] == "resume"]
    assert [r["step"] for r in resumed] == [reached], "0 steps lost"
    assert resumed[0]["reason"] == "signal"

    assert_same_weights_as_the_reference(tmp_path, run_dir)
