"""Real multi-process runs on CPU with gloo: accuracy, shards, accumulation, resume, preflight."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from support.trainer_runs import ROOT, Launcher, records

from kubetrain.trainer.checkpoint import Checkpointer, complete_checkpoints, latest_checkpoint, read_checkpoint

pytestmark = pytest.mark.train

TRAIN = ["-m", "kubetrain.trainer", "train"]
PREFLIGHT = ["-m", "kubetrain.trainer", "preflight"]


def _ok(results: list[tuple[int, str, str]]) -> str:
    for rank, (code, _, err) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{err[-3000:]}"
    return results[0][1]


def test_digits_reaches_90_percent(launcher: Launcher, make_config: Any, tmp_path: Path) -> None:
    """One pod of 4 processes, the default command's shape (a bare torchrun), with the preflight
    on. Two nodes of one process reach it too: tests/local/test_training.py, the README's run."""
    world = 4
    config = make_config(tmp_path, epochs=8, learningRate=0.005)
    config.training.preflight = True
    out = _ok(launcher.torchrun(4, ["--nproc-per-node", "4", *TRAIN], config=config).wait(240))
    recs = records(out)
    preflight = recs.pop(0)
    assert preflight["event"] == "preflight" and preflight["ok"] and preflight["world_size"] == 4
    assert recs[0]["event"] == "start" and recs[0]["world_size"] == world and recs[0]["backend"] == "gloo"
    done = recs[-1]
    assert done["event"] == "done" and done["step"] == done["total_steps"]
    assert done["accuracy"] >= 0.90, done
    evals = [r for r in recs if r["event"] == "eval"]
    assert len(evals) == 8 and evals[-1]["accuracy"] == done["accuracy"]
    # The metrics file beside the checkpoints holds exactly what stdout held.
    assert records((tmp_path / "metrics.jsonl").read_text())[-len(recs) :] == recs
    for rec in recs:
        assert {"event", "time", "step", "epoch", "total_steps"} <= rec.keys()
        if rec["event"] == "step":
            assert {"loss", "lr", "samples_per_s", "step_time_s"} <= rec.keys()


def test_shards_disjoint_and_accumulation_matches_big_batch(launcher: Launcher) -> None:
    # Four ranks: the digits split (1437 samples) leaves one sample over, as two would.
    world = 4
    gang = launcher.ranks(world, [str(Path(__file__).with_name("worker_checks.py"))])
    # Its last line (rank 0's rendezvous mark comes first).
    result = json.loads(_ok(gang.wait(180)).splitlines()[-1])
    size = result["shards"]["dataset_size"]
    orders = []
    for everyone in result["shards"]["epochs"]:
        seen = Counter(i for shard in everyone for i in shard)
        # Each visited sample exactly once across ranks; the sampler trims fewer than `world`.
        assert max(seen.values()) == 1
        assert len(seen) == size - size % world
        assert all(len(shard) == size // world for shard in everyone)
        orders.append(everyone[0])
    assert orders[0] != orders[1], "set_epoch must reshuffle"

    # DDP was used: its process group still ended with destroy_process_group (see dist.py).
    assert result["threads_after_teardown"] == [], "no thread of c10d outlived the teardown"
    for rank, acc in enumerate(result["accumulation"]):
        assert acc["max_abs_diff"] < 1e-6, (rank, acc)
        # no_sync held for the 3 non-final micro-steps: only the last one all-reduced.
        assert acc["accumulated_allreduce_calls"] == acc["big_batch_calls"] >= 1, (rank, acc)


def _final_model(directory: Path) -> dict[str, Any]:
    path = latest_checkpoint(directory)
    assert path is not None
    payload, _ = read_checkpoint(path)
    state: dict[str, Any] = payload["state"]
    return state


def test_sigkill_one_rank_then_resume_is_bitwise(launcher: Launcher, make_config: Any, tmp_path: Path) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    cadence = {"epochs": 5, "logEverySteps": 5}

    # The uninterrupted run saves only at epoch ends: saving must not perturb the trajectory either.
    # It runs alongside the one that gets killed (fewer launches; a slower run is easier to catch).
    reference = launcher.ranks(2, TRAIN, config=make_config(straight, **cadence))
    interrupted = make_config(killed, **cadence)
    interrupted.checkpoint.every_steps = 15

    gang = launcher.ranks(2, TRAIN, config=interrupted)
    rank0, rank1 = gang.procs
    assert rank0.stdout is not None
    kill_at = None
    for line in rank0.stdout:
        rec = json.loads(line)
        # Mid-epoch (44 steps per epoch), after at least two complete checkpoints.
        if rec["event"] == "checkpoint" and rec["step"] >= 60:
            os.kill(rank1.pid, signal.SIGKILL)
            kill_at = rec["step"]
            break
    assert kill_at is not None, "the run ended before it could be killed"
    rest, _ = rank0.communicate(timeout=120)
    rank1.wait(30)
    assert rank1.returncode == -signal.SIGKILL
    assert rank0.returncode != 0, "rank 0 must fail when its peer dies"
    assert "done" not in {json.loads(line)["event"] for line in rest.splitlines()}, "killed too late"
    _ok(reference.wait(240))
    saved = [step for step, _ in complete_checkpoints(killed)]
    assert saved and saved[-1] >= kill_at and saved[-1] < 220

    resumed = launcher.ranks(2, TRAIN, config=interrupted)
    recs = records(_ok(resumed.wait(240)))
    start = recs[0]
    assert start["event"] == "start" and start["resumed_from"] == str(killed / f"step-{saved[-1]}")
    assert recs[1]["event"] == "resume" and recs[1]["step"] == saved[-1]
    assert recs[-1]["event"] == "done" and recs[-1]["step"] == 220

    a, b = _final_model(straight), _final_model(killed)
    assert a["step"] == b["step"] == 220
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), f"{name} differs after resume"
    for pid, slot in a["optimizer"]["state"].items():
        for key, value in slot.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["optimizer"]["state"][pid][key]))


def test_resume_refuses_other_configuration(launcher: Launcher, make_config: Any, tmp_path: Path) -> None:
    original = make_config(tmp_path, epochs=1)
    Checkpointer(tmp_path, rank=0, world_size=1, fingerprint=original.fingerprint()).save(3, {"step": 3})
    changed = make_config(tmp_path, epochs=1, learningRate=0.01)
    [(code, out, err)] = launcher.ranks(1, TRAIN, config=changed).wait(120)
    assert code == 1, err[-2000:]
    assert "refusing to resume" in err and "different training configuration" in err
    assert records(out) == [], "no metrics record before the refusal"
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [3], "the checkpoint must be left alone"


def test_preflight_passes(launcher: Launcher) -> None:
    # Four ranks, where bus and algorithm bandwidth differ (2 (w-1)/w = 1.5); two ranks run the
    # preflight in test_preflight_fails_clearly_on_wrong_world_size.
    world = 4
    out = _ok(launcher.ranks(world, PREFLIGHT).wait(180))
    [rec] = records(out)
    assert rec["event"] == "preflight" and rec["ok"] is True and rec["world_size"] == world
    ops = {op["op"]: op for op in rec["ops"]}
    assert set(ops) == {
        "broadcast",
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "gather",
        "scatter",
        "send_recv_ring",
    }
    assert all(op["ok"] for op in ops.values())
    assert "emulated" in ops["reduce_scatter"]["note"]
    for probe in rec["bandwidth"]:
        assert probe["busbw_gbps"] > 0
        assert probe["busbw_gbps"] == pytest.approx(probe["algbw_gbps"] * 2 * (world - 1) / world, rel=1e-3, abs=2e-4)


def test_preflight_fails_clearly_on_wrong_world_size(launcher: Launcher) -> None:
    gang = launcher.ranks(2, PREFLIGHT, env_override={1: {"WORLD_SIZE": "3"}})
    results = gang.wait(120)
    expected = "rank 1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2"
    for rank, (code, _, err) in enumerate(results):
        assert code == 1, (rank, err[-2000:])
        assert expected in err, (rank, err[-2000:])
    [rec] = records(results[0][1])
    assert rec["event"] == "preflight" and rec["ok"] is False and expected in rec["error"]


def test_byo_example_trains_with_the_library(launcher: Launcher, tmp_path: Path) -> None:
    script = str(ROOT / "examples" / "byo_train.py")
    recs = records(_ok(launcher.ranks(2, [script, "--epochs", "2", "--checkpoint-dir", str(tmp_path)]).wait(180)))
    assert [r["event"] for r in recs] == ["start", "eval", "checkpoint", "eval", "checkpoint", "done"]
    assert recs[0]["world_size"] == 2 and recs[0]["total_steps"] == recs[-1]["step"] > 0
    assert recs[-1]["accuracy"] >= 0.8
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [recs[2]["step"], recs[4]["step"]]
    assert records((tmp_path / "metrics.jsonl").read_text()) == recs
