"""Real 2-node gloo training through `kubetrain run --local` (torch on CPU)."""

from __future__ import annotations

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
from support.local_runs import alive, records, run_cli, start_run, summary
from support.waiting import wait_for

pytestmark = [pytest.mark.unit, pytest.mark.slow]


def final_state(run_dir: Path) -> dict[str, Any]:
    steps = sorted(run_dir.glob("checkpoints/step-*/meta.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    state: dict[str, Any] = torch.load(steps[-1].parent / "state.pt", weights_only=False)
    return state


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


# The kill comes at the first checkpoint (step 20); the steps after it are the test's time to
# react. At 120 steps a loaded machine saw rank 0 record `done` first, and the late-crash rule
# then rightly ended the run Succeeded without a restart.
KILL_JOB = {"epochs": 20, "maxSteps": 600, "logEverySteps": 5}


def test_killing_a_node_restarts_the_gang_and_ends_with_the_same_weights(tmp_path: Path) -> None:
    job = digits_job(**KILL_JOB)
    job["spec"]["checkpoint"]["everySteps"] = 20
    job_file = write_job(tmp_path, job)

    reference = start_run(job_file, tmp_path / "reference")
    out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out[-4000:]

    run_dir = tmp_path / "killed"
    proc = start_run(job_file, run_dir)
    wait_for(
        lambda: next((r for r in records(run_dir) if r["event"] == "checkpoint" and r["step"] >= 20), None),
        240,
        "a checkpoint at step 20",
        proc=proc,
    )
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
    assert 20 <= resumed <= max(first_attempt_steps) < total, "killed mid-run, resumed from its last checkpoint"

    expected, got = final_state(tmp_path / "reference")["state"], final_state(run_dir)["state"]
    assert got["step"] == expected["step"] == total
    assert expected["model"].keys() == got["model"].keys()
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, got["model"][name]), f"{name} differs after the resumed run"


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
