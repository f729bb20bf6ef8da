"""The in-place gang restart through `kubetrain run --local`: real torchrun agents, real gloo DDP."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from support.jobs import digits_job, write_job
from support.local_runs import final_state, records, run_status, start_run, summary

pytestmark = pytest.mark.train

# 3 epochs of 22 steps, saved at each epoch end only (no periodic saves); node 1's worker is
# SIGKILLed after step 30. Node 0's worker, whose next collective fails, saves step 30 alone (the
# survivor's save, kubetrain.runtime.worker.survivor), so the gang resumes there: no step lost, where
# the last save before the death was step 22's.
JOB = {"epochs": 3, "logEverySteps": 5}
FAULT = "kill,rank=1,step=30"
SURVIVOR_WORDS = ("peer", "survivor", "killing", "on their own", "arm", "Error", "ordered", "failure")
PIDS = re.compile(r"\[kubetrain\] attempt (\d+): node-0 pid (\d+), node-1 pid (\d+)")


def test_a_crashed_worker_restarts_the_gang_in_place_with_the_same_agents_and_weights(tmp_path: Path) -> None:
    job = digits_job(**JOB)
    job["spec"]["checkpoint"].pop("everySteps")  # the example's 40 would not come before step 30 anyway
    faulty = copy.deepcopy(job)
    faulty["spec"]["env"] = [{"name": "KUBETRAIN_FAULT", "value": FAULT}]

    reference = start_run(write_job(tmp_path, job), tmp_path / "reference")
    out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out[-4000:]

    run_dir = tmp_path / "crashed"
    proc = start_run(write_job(tmp_path, faulty, "faulty.yaml"), run_dir)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]

    # The node processes (torchrun agents) are the same in both attempts: nothing was restarted but workers.
    attempts = {int(m.group(1)): (m.group(2), m.group(3)) for m in PIDS.finditer(out)}
    assert sorted(attempts) == [0, 1] and attempts[0] == attempts[1], out[-4000:]
    assert "restarting the whole gang in place as attempt 1 (restart 1 of 3)" in out

    status = run_status(run_dir)
    (failure,) = status.failures or []
    assert (status.restarts, failure.rank, failure.exit_code, failure.pod) == (1, 1, 137, "digits-cpu-node-1")
    assert "worker rank 1" in failure.message
    line = status.timeline
    assert line is not None and (line.attempt, line.start) == (1, "InPlace")
    assert line.failed_at is not None and line.first_step_at is not None and line.first_step_at > line.failed_at
    assert line.pods_created_at is None, "no pod was created for the in-place attempt"
    result = summary(run_dir)
    assert (result["outcome"], result["restarts"], result["attempts"]) == ("Succeeded", 1, 2)

    metrics = records(run_dir)
    resumed = [r for r in metrics if r["event"] == "resume"]
    assert [r["step"] for r in resumed] == [30] and resumed[0]["attempt"] == 1, _survivor_lines(run_dir)
    assert [r["reason"] for r in metrics if r["event"] == "checkpoint" and r["step"] == 30] == ["peer_lost"]

    expected, got = final_state(tmp_path / "reference")["state"]["model"], final_state(run_dir)["state"]["model"]
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(tensor, got[name]), f"{name} differs from the uninterrupted run"


def _survivor_lines(run_dir: Path) -> str:
    """What the nodes said around the failure (the survivor's save, the agents' waits and kills):
    enough to tell, from a CI log alone, why step 30 was not saved."""
    said = []
    for log in sorted(run_dir.glob("node-*.log")):
        lines = log.read_text(errors="replace").splitlines()
        said += [f"{log.name}: {line[:400]}" for line in lines if any(k in line for k in SURVIVOR_WORDS)]
    return "\n".join(said[-40:])
