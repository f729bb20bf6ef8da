"""The built-in trainer on CUDA GPUs through `kubetrain run --local`, as examples/cnn-gpu.yaml
asks for it: NCCL, bf16, one process per GPU, DataLoader workers, the preflight, and an in-place
restart whose workers are forks of their torchrun agent (an agent that had initialised CUDA
could not fork working ones). CI has no GPU: these skip there, naming it; docs/testing.md says
where they ran."""

from __future__ import annotations

import copy
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from support.jobs import ROOT, training_job, write_job
from support.local_runs import final_state, records, run_status, start_run, summary
from support.waiting import wait_for

pytestmark = [
    pytest.mark.train,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

PIDS = re.compile(r"\[kubetrain\] attempt (\d+): ((?:node-\d+ pid \d+(?:, )?)+)")


def gpu_job(**training: Any) -> dict[str, Any]:
    """examples/cnn-gpu.yaml on this machine's GPUs: up to 2 nodes of 1 GPU (NCCL refuses two
    ranks on one GPU), 20 epochs (220 steps on one GPU, 100 on two), a checkpoint every 20 steps."""
    job = training_job(ROOT / "examples" / "cnn-gpu.yaml")
    job["spec"].update(nodes=min(2, torch.cuda.device_count()), gpusPerNode=1)
    job["spec"]["training"].update({"epochs": 20, "logEverySteps": 5, **training})
    job["spec"]["checkpoint"].update(everySteps=20, everySeconds=None)
    return job


def finish(job_file: Path, run_dir: Path) -> str:
    proc = start_run(job_file, run_dir)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return out


def test_a_crashed_gpu_worker_restarts_in_place_on_nccl(tmp_path: Path) -> None:
    job = gpu_job()
    last = job["spec"]["nodes"] - 1
    faulty = copy.deepcopy(job)
    faulty["spec"]["env"] = [{"name": "KUBETRAIN_FAULT", "value": f"kill,rank={last},step=30"}]
    finish(write_job(tmp_path, job), tmp_path / "reference")
    out = finish(write_job(tmp_path, faulty, "faulty.yaml"), tmp_path / "crashed")

    run_dir = tmp_path / "crashed"
    metrics = records(run_dir)
    starts = [r for r in metrics if r["event"] == "start"]
    assert [(r["backend"], r["world_size"]) for r in starts] == [("nccl", job["spec"]["nodes"])] * 2
    attempts = {int(m.group(1)): m.group(2) for m in PIDS.finditer(out)}
    assert sorted(attempts) == [0, 1] and attempts[0] == attempts[1], "the same torchrun agents ran both attempts"
    logs = "".join(log.read_text() for log in run_dir.rglob("node-*.log"))
    assert "starting the worker cold" not in logs, "the workers were warm forks that could use CUDA"
    status = run_status(run_dir)
    (failure,) = status.failures or []
    assert (status.restarts, failure.rank, failure.exit_code) == (1, last, 137)
    resumed = [r for r in metrics if r["event"] == "resume"]
    saved = max(r["step"] for r in metrics if r["event"] == "checkpoint" and r["step"] <= 30)
    assert [r["step"] for r in resumed] == [saved]
    line = status.timeline
    assert line is not None and line.failed_at is not None and line.first_step_at is not None
    reference = summary(tmp_path / "reference")
    result = summary(run_dir)
    assert result["outcome"] == reference["outcome"] == "Succeeded"
    assert result["finalAccuracy"] > 0.5 and abs(result["finalAccuracy"] - reference["finalAccuracy"]) <= 0.03
    expected, got = final_state(tmp_path / "reference")["state"], final_state(run_dir)["state"]
    differs = max(
        (expected["model"][k].float() - got["model"][k].float()).abs().max().item() for k in expected["model"]
    )
    recovery = (line.first_step_at - line.failed_at).total_seconds()
    print(
        f"\nGPU in-place restart: failure -> first step {recovery:.2f} s; largest weight difference "
        f"from the uninterrupted run {differs:.3g} ({torch.cuda.get_device_name(0)}, torch {torch.__version__})"
    )


def test_ctrl_c_on_a_gpu_job_checkpoints_the_step_and_a_rerun_resumes_it(tmp_path: Path) -> None:
    job = gpu_job()
    job["spec"]["checkpoint"]["everySteps"] = 1_000_000
    job["spec"]["env"] = [{"name": "KUBETRAIN_FAULT", "value": "slow,rank=0,step=30,ms=300"}]
    job_file, run_dir = write_job(tmp_path, job), tmp_path / "run"
    proc = start_run(job_file, run_dir)
    wait_for((run_dir / "checkpoints" / ".faults" / "slow-rank0-step30").exists, 300, "rank 0 slowed", proc=proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 130, out[-4000:]
    stopped = [r for r in records(run_dir) if r["event"] == "checkpoint" and r["reason"] == "signal"]
    assert len(stopped) == 1
    last_step = max(r["step"] for r in records(run_dir) if r["event"] == "step")
    assert stopped[0]["step"] >= last_step, "no step trained before the signal is lost"

    finish(job_file, run_dir)
    resumed = [r for r in records(run_dir) if r["event"] == "resume"]
    assert resumed[-1]["step"] == stopped[0]["step"] and resumed[-1]["reason"] == "signal"
    assert summary(run_dir)["outcome"] == "Succeeded"
