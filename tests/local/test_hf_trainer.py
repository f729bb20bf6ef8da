"""A Hugging Face `Trainer` script as its users write it (tests/support/workloads/hf_gpt2.py: a tiny
GPT-2, `Trainer`, a resume from `get_last_checkpoint`), importing nothing of kubetrain, through
`kubetrain run --local` on 2 nodes: kubetrain's adapter (kubetrain.runtime.guest.hf_adapter) gives it
progress, its checkpoints and the zero-loss stop on Ctrl-C."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.jobs import ROOT, bare_job, write_job
from support.local_runs import drain, records, run_cli, run_status, start_run, summary
from support.waiting import wait_for

pytestmark = pytest.mark.train

SCRIPT = ROOT / "tests" / "support" / "workloads" / "hf_gpt2.py"
SAVE_STEPS = 20


def hf_job(max_steps: int) -> dict[str, Any]:
    return bare_job(
        "hf-gpt2",
        nodes=2,
        gpusPerNode=0,
        image="kubetrain/trainer:0.1.0-cpu",
        command=["torchrun", str(SCRIPT)],
        args=["--max_steps", str(max_steps), "--save_steps", str(SAVE_STEPS)],
        checkpoint={"dir": "/checkpoints"},
    )


def test_ctrl_c_saves_the_step_every_rank_stopped_at_and_a_rerun_loses_none(tmp_path: Path) -> None:
    # max_steps out of reach: the run cannot end before the test's Ctrl-C, by construction.
    run_dir = tmp_path / "run"
    proc = start_run(write_job(tmp_path, hf_job(max_steps=1_000_000)), run_dir)
    output, reader = drain(proc)
    periodic = wait_for(
        lambda: next((r for r in records(run_dir) if r["event"] == "checkpoint"), None),
        240,
        "the first periodic checkpoint",
        proc=proc,
    )
    assert (periodic["step"], periodic["reason"]) == (SAVE_STEPS, "periodic")
    nodes = psutil.Process(proc.pid).children(recursive=True)
    assert len(nodes) >= 4, "torchrun and one worker per node"
    proc.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C: `kubetrain run` SIGTERMs every node
    signalled = time.monotonic()
    psutil.wait_procs(nodes, timeout=60)
    stop_s = time.monotonic() - signalled
    assert proc.wait(timeout=60) == 130
    reader.join(timeout=10)
    out = "".join(output)
    assert stop_s < 10, f"the nodes took {stop_s:.1f} s to stop\n{out[-4000:]}"

    first = records(run_dir)
    reached = max(r["step"] for r in first if r["event"] == "step")
    (saved,) = [r for r in first if r["event"] == "checkpoint" and r["reason"] == "signal"]
    assert saved["step"] == reached > SAVE_STEPS, "the stop saved the last step trained, and nothing ran after it"
    folders = sorted(run_dir.glob("checkpoints/checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert saved["path"] == str(folders[-1]) == str(run_dir / "checkpoints" / f"checkpoint-{reached}")
    assert "done" not in [r["event"] for r in first]
    for node in (0, 1):
        assert f"rank {node} stopped at step {reached} by SIGTERM" in (run_dir / f"node-{node}.log").read_text()
        assert "exiting 143" in (run_dir / f"node-{node}.log").read_text()
    # The adapter reports alone: step_watch's optimizer records stay silent, one rendezvous mark.
    node0 = (run_dir / "node-0.log").read_text()
    assert '"source":"optimizer"' not in node0 and node0.count('"event":"rendezvous"') == 1
    assert run_status(run_dir).timeline.rendezvous_at is not None  # type: ignore[union-attr]
    result = summary(run_dir)
    assert (result["outcome"], result["exitCode"]) == ("Interrupted", 130)
    last_loss = [r["loss"] for r in first if r["event"] == "step"][-1]
    assert (result["finalStep"], result["finalLoss"]) == (reached, last_loss)
    assert result["lastCheckpoint"]["path"] == saved["path"] and result["lastCheckpoint"]["reason"] == "signal"
    assert run_status(run_dir).progress.total_steps == 1_000_000  # type: ignore[union-attr]
    assert result["plot"] and Path(result["plot"]).stat().st_size > 10_000
    assert f"final step    {reached}" in out

    # The same script and run dir, 10 steps more: it resumes the stop's checkpoint and ends there.
    rerun = run_cli(
        "run", str(write_job(tmp_path, hf_job(max_steps=reached + 10))), "--local", "--run-dir", str(run_dir)
    )
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-4000:]
    second = records(run_dir)[len(first) :]
    start, resume = second[0], second[1]
    assert (start["event"], start["step"], start["resumed_from"]) == ("start", reached, saved["path"]), "0 steps lost"
    assert (resume["event"], resume["step"], resume["path"]) == ("resume", reached, saved["path"])
    assert [r["step"] for r in second if r["event"] == "step"] == list(range(reached + 1, reached + 11))
    assert (second[-1]["event"], second[-1]["step"]) == ("done", reached + 10)
    again = summary(run_dir)
    assert (again["outcome"], again["finalStep"]) == ("Succeeded", reached + 10)
    assert again["lastCheckpoint"]["reason"] == "final"
