"""What a zero-loss stop costs (kubetrain.runtime.worker.stopping), measured on this machine.

    .venv/bin/python benchmarks/stop_on_signal.py [--parts vote,stop] [--rounds 60] [--reps 5]

1. vote: the per-step cost of `StopSignal.agreed()` (one async all_reduce of one integer per
   optimizer step) while no signal is pending. 2 ranks (gloo, one thread each) train the
   same DDP MLP, data and AdamW loop as the built-in trainer (`accumulate_gradients`), in
   four arms: `none`, `vote` (agreed() once per step), `vote_every_step` (the same with
   VOTE_INTERVAL_S = 0: a vote after every step, as StopSignal did before it had an
   interval) and `none_again` (the `none` code once more: an A/A control that shows what
   "no difference" looks like on this machine).
   The arms alternate in blocks of about `--block-seconds` inside the same processes, in
   an order that rotates every round, for `--rounds` rounds after an unrecorded warm-up;
   each ratio is taken between blocks of one round, so machine drift cancels. Each block
   is timed in wall time (what a user waits) and in the processes' CPU time (what the vote
   adds to the work, less disturbed by other load than wall time). The cost is within the
   noise when the bootstrap 95% interval of its median ratio to `none` overlaps that of
   none_again/none. Models: the README's digits MLP (a step of about a millisecond
   idle: where the vote's fixed cost would show first) and a 1.3M-parameter MLP
   (benchmarks/trainer_overhead.py's, about ten times the step). `votes_per_step` counts
   the all_reduces the vote arm started (StopSignal spaces them about VOTE_INTERVAL_S
   apart); `vote_alone_us` is one vote's collective with no step to hide under.
2. stop: `kubetrain run --local` of the README's example (examples/digits-cpu.yaml, periodic
   saves off, logging every step) and of the same job with a ~100M-parameter MLP on
   synthetic data (AdamW: a 1.2 GB checkpoint). Each repetition waits for a step record
   mid-epoch (the run has thousands of steps or most of an epoch left, so it cannot end
   first), sends SIGINT to the kubetrain process (Ctrl-C) and measures signal -> meta.json
   of the `signal` checkpoint (its mtime: the checkpoint is complete), signal -> exit of
   the trainer processes, of the node processes (torchrun: what a pod's grace period
   bounds) and of the command (after its summary and plot), and the checkpoint's size.
   Rank 0's records split the first into reaching the step boundary and the save itself.
   Compared with the pods' default grace period (api/contract.py DEFAULT_GRACE_SECONDS).

Results go to benchmarks/results/stop_on_signal.json (or --output) with the load averages.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import yaml
from ranks import machine, max_over_ranks, spawn

from kubetrain.api.contract import DEFAULT_GRACE_SECONDS
from kubetrain.api.records import records_in

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "stop_on_signal.json"
KUBETRAIN = str(Path(sys.executable).parent / "kubetrain")
EXAMPLE = ROOT / "examples" / "digits-cpu.yaml"

# name -> (input features, hidden width, per-rank batch) of trainer.model.MLP.
VOTE_MODELS = {"digits": (64, 128, 32), "mlp-1m": (256, 1024, 64)}
ARMS = ("none", "vote", "vote_every_step", "none_again")
VOTE_ARMS = ("vote", "vote_every_step", "none_again")  # each compared with `none`

# name -> changes to the README example's `training`, and the step record to wait for.
STOP_MODELS: dict[str, tuple[dict[str, Any], int]] = {
    # The README's example as it is, with 1000 epochs (22 steps each) so it cannot end first.
    "digits": ({"epochs": 1000}, 30),
    # 4096 -> 8192 -> 8192 -> 10: 100.76M parameters; one epoch is 250 steps of 8 per rank.
    "mlp-100m": (
        {
            "dataset": "synthetic",
            "syntheticSamples": 4096,
            "syntheticFeatures": 4096,
            "hiddenSize": 8192,
            "testFraction": 0.02,
            "batchSize": 8,
            "epochs": 1,
        },
        3,
    ),
}
RUN_TIMEOUT_S = 600


def mlp_params(features: int, hidden: int, classes: int = 10) -> int:
    return features * hidden + hidden + hidden * hidden + hidden + hidden * classes + classes


# --- 1. the vote, inside 2 ranks ---------------------------------------------------------


def _vote_model(ctx: Any, name: str, rounds: int, block_seconds: float) -> dict[str, Any]:
    """Seconds per step of each arm, block by block, for one model."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from kubetrain.runtime.worker import stopping
    from kubetrain.runtime.worker.stopping import StopSignal
    from kubetrain.trainer.model import MLP
    from kubetrain.trainer.train import accumulate_gradients

    features, hidden, batch = VOTE_MODELS[name]
    gen = torch.Generator().manual_seed(ctx.rank)
    data = [
        (torch.randn(batch, features, generator=gen), torch.randint(0, 10, (batch,), generator=gen)) for _ in range(4)
    ]
    torch.manual_seed(0)
    model = DDP(MLP(features, hidden, 10), gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches: Iterator[Any] = itertools.cycle(data)
    # The product's vote, and the same with VOTE_INTERVAL_S = 0: a vote after every step, as
    # StopSignal did before the interval (the cost the interval removes, measured alongside).
    signals = {"vote": StopSignal(ctx), "vote_every_step": StopSignal(ctx)}
    all_reduce, interval = dist.all_reduce, stopping.VOTE_INTERVAL_S
    votes = {arm: [0, 0] for arm in signals}  # all_reduces started, steps

    def block(steps: int, arm: str) -> tuple[float, float]:
        """(wall seconds, CPU seconds of the process: gloo's threads too) per step, max over ranks."""
        stop = signals.get(arm)

        def counting(*args: Any, **kwargs: Any) -> Any:  # the votes StopSignal starts
            votes[arm][0] += 1
            return all_reduce(*args, **kwargs)

        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        if stop is not None:
            dist.all_reduce = counting
            stopping.VOTE_INTERVAL_S = 0.0 if arm == "vote_every_step" else interval
        try:
            for _ in range(steps):
                accumulate_gradients(model, batches, 1)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if stop is not None and stop.agreed():
                    raise RuntimeError("the ranks agreed to stop, but nothing was signalled")
        finally:
            dist.all_reduce, stopping.VOTE_INTERVAL_S = all_reduce, interval
        if stop is not None:
            stop.close()  # the vote in flight: the arm pays for every vote it started
            votes[arm][1] += steps
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return max_over_ranks(wall) / steps, max_over_ranks(cpu) / steps

    # Warm-up (unrecorded): first-call costs, and the step time that sizes the blocks (the
    # max over ranks, so both ranks choose the same number of steps).
    for arm in ARMS + ARMS:
        step_s, _ = block(10, arm)
    steps = max(5, round(block_seconds / step_s))
    wall: dict[str, list[float]] = {arm: [] for arm in ARMS}
    cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for round_ in range(rounds):
        shift = round_ % len(ARMS)
        for arm in ARMS[shift:] + ARMS[:shift]:
            wall_s, cpu_s = block(steps, arm)
            wall[arm].append(wall_s)
            cpu[arm].append(cpu_s)

    # One vote's collective (StopSignal's all_reduce of two integers) with no step to hide under.
    flag = torch.zeros(2, dtype=torch.int64)
    repeats = 2000 if name == "digits" else 500
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(flag, async_op=True).wait()
    vote_alone_s = max_over_ranks(time.perf_counter() - start) / repeats
    return {
        "steps_per_block": steps,
        "wall_s": wall,
        "cpu_s": cpu,
        "vote_alone_s": vote_alone_s,
        "votes_per_step": {arm: started / steps_ for arm, (started, steps_) in votes.items()},
    }


def vote_worker(args: argparse.Namespace) -> None:
    import torch

    from kubetrain.runtime.worker import dist as kdist

    torch.set_num_threads(1)
    with kdist.distributed("gloo", timeout_s=600, connect_timeout_s=60) as ctx:
        raw = {name: _vote_model(ctx, name, args.rounds, args.block_seconds) for name in args.models.split(",")}
        if ctx.rank == 0:
            Path(args.out).write_text(json.dumps({"raw": raw, "machine": machine()}))


def _bootstrap_median_ci(values: list[float], resamples: int = 2000) -> list[float]:
    """95% percentile-bootstrap interval of the median (seeded: the same data gives the same interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return [medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]]


def _p10(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[0] if len(values) > 1 else values[0]


def _spread(values: list[float]) -> dict[str, Any]:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {
        "median": round(statistics.median(values), 4),
        "p25": round(quartiles[0], 4),
        "p75": round(quartiles[2], 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "median_ci95": [round(v, 4) for v in _bootstrap_median_ci(values)],
    }


def compare(per_step: dict[str, list[float]]) -> dict[str, Any]:
    """Each vote arm, and the A/A control `none_again`, against `none`, block pair by pair. A vote
    arm is within the noise when its ratio's interval overlaps the control's."""
    result: dict[str, Any] = {
        "ms_per_step_median": {arm: round(statistics.median(per_step[arm]) * 1000, 4) for arm in ARMS},
        "ms_per_step_p10": {arm: round(_p10(per_step[arm]) * 1000, 4) for arm in ARMS},
    }
    for arm in VOTE_ARMS:
        pairs = list(zip(per_step[arm], per_step["none"], strict=True))
        result[f"{arm}_over_none"] = _spread([a / n for a, n in pairs])
        result[f"{arm}_minus_none_us"] = _spread([(a - n) * 1e6 for a, n in pairs])
    null_lo, null_hi = result["none_again_over_none"]["median_ci95"]
    for arm in VOTE_ARMS[:-1]:
        lo, hi = result[f"{arm}_over_none"]["median_ci95"]
        result[f"{arm}_within_noise"] = lo <= null_hi and null_lo <= hi
    return result


def vote_summary(raw: dict[str, Any]) -> dict[str, Any]:
    models = {}
    for name, result in raw.items():
        features, hidden, batch = VOTE_MODELS[name]
        wall = compare(result["wall_s"])
        models[name] = {
            "model": f"MLP {features}-{hidden}-{hidden}-10, AdamW, batch {batch} per rank",
            "params": mlp_params(features, hidden),
            "steps_per_block": result["steps_per_block"],
            "blocks_per_arm": len(result["wall_s"]["none"]),
            "wall": wall,
            "cpu": compare(result["cpu_s"]),
            "votes_per_step": {arm: round(v, 4) for arm, v in result["votes_per_step"].items()},
            "vote_alone_us": round(result["vote_alone_s"] * 1e6, 1),
            "vote_alone_over_step": round(result["vote_alone_s"] / statistics.median(result["wall_s"]["none"]), 4),
            "raw_s_per_step": result,
        }
    return models


def run_vote(args: argparse.Namespace) -> dict[str, Any]:
    load = os.getloadavg()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kubetrain-bench-") as scratch:
        out = Path(scratch) / "raw.json"
        argv = ["--worker", "--out", str(out), "--models", args.models]
        argv += ["--rounds", str(args.rounds), "--block-seconds", str(args.block_seconds)]
        spawn(__file__, argv, 2)
        raw = json.loads(out.read_text())
    return {
        "what": (
            "per-step wall and CPU time with StopSignal.agreed() once per step (vote) and without (none, "
            "none_again: the same code twice, an A/A control), blocks alternating in one pair of processes; "
            "ratios and differences per round"
        ),
        "ranks": 2,
        "rounds": args.rounds,
        "block_seconds": args.block_seconds,
        "within_noise_rule": "the 95% bootstrap interval of median(arm/none) overlaps that of median(none_again/none)",
        "cpu_note": "CPU seconds of each rank's process (time.process_time: gloo's threads included), max over ranks",
        "load_average_before": [round(v, 2) for v in load],
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        "wall_s": round(time.monotonic() - start, 1),
        "machine": raw["machine"],
        "models": vote_summary(raw["raw"]),
    }


# --- 2. signal -> checkpoint, through `kubetrain run --local` ----------------------------


def stop_job(model: str) -> dict[str, Any]:
    """The README example's TrainingJob, periodic saves off, a record every step, `model`'s training."""
    job: dict[str, Any] = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "TrainingJob")
    job["metadata"]["name"] = f"stop-{model}"
    job["spec"]["training"].update(logEverySteps=1, **STOP_MODELS[model][0])
    job["spec"]["checkpoint"]["everySteps"] = 1_000_000
    return job


def _records(run_dir: Path) -> list[dict[str, Any]]:
    metrics = run_dir / "checkpoints" / "metrics.jsonl"
    return records_in(metrics.read_text()) if metrics.exists() else []


def _wait_for_step(run_dir: Path, proc: subprocess.Popen[bytes], step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit code {proc.returncode}) before step {step}")
        if any(r["event"] == "step" and r["step"] >= step for r in _records(run_dir)):
            return
        time.sleep(0.05)
    raise RuntimeError(f"no step {step} record within {timeout}s")


def _tree(proc: subprocess.Popen[bytes]) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(node processes, trainer processes) under the kubetrain process: the pods' first
    processes (torchrun) and their workers."""
    nodes = psutil.Process(proc.pid).children()
    return nodes, [worker for node in nodes for worker in node.children(recursive=True)]


def _ended(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def one_stop(model: str, job_file: Path, run_dir: Path) -> dict[str, Any]:
    load = os.getloadavg()
    proc = subprocess.Popen(
        [KUBETRAIN, "run", str(job_file), "--local", "--run-dir", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ended: dict[int, float] = {}
    try:
        _wait_for_step(run_dir, proc, STOP_MODELS[model][1], RUN_TIMEOUT_S)
        nodes, workers = _tree(proc)
        signalled = time.time()
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + DEFAULT_GRACE_SECONDS + 60
        while proc.poll() is None and time.monotonic() < deadline:
            for process in nodes + workers:
                if process.pid not in ended and _ended(process):
                    ended[process.pid] = time.time()
            time.sleep(0.01)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        exited = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    records = _records(run_dir)
    steps = [r for r in records if r["event"] == "step"]
    (saved,) = [r for r in records if r["event"] == "checkpoint" and r.get("reason") == "signal"]
    earlier = [r["step"] for r in records if r["event"] == "checkpoint" and r["time"] < signalled]
    boundary = next(r for r in steps if r["step"] == saved["step"])  # logged just before the vote agreed
    before = [r for r in steps if r["time"] <= signalled]
    step_dir = Path(saved["path"])
    meta_written = (step_dir / "meta.json").stat().st_mtime
    summary = json.loads((run_dir / "summary.json").read_text())

    def last_end(processes: list[psutil.Process]) -> float | None:
        times = [ended.get(p.pid, exited) for p in processes]
        return round(max(times) - signalled, 3) if times else None

    return {
        "exit_code": proc.returncode,
        "node_exit_codes": summary.get("nodeExitCodes"),
        "last_step_logged_before_signal": before[-1]["step"] if before else None,
        "saved_step": saved["step"],
        "newest_checkpoint_before_signal": max(earlier) if earlier else None,
        "steps_after_signal": saved["step"] - (before[-1]["step"] if before else 0),
        "step_time_s": round(statistics.median(r["step_time_s"] for r in steps), 4),
        "signal_to_checkpoint_s": round(meta_written - signalled, 3),
        "signal_to_step_boundary_s": round(boundary["time"] - signalled, 3),
        "save_s": round(meta_written - boundary["time"], 3),
        "signal_to_trainers_exit_s": last_end(workers),
        "signal_to_nodes_exit_s": last_end(nodes),
        "signal_to_command_exit_s": round(exited - signalled, 3),
        "checkpoint_bytes": sum(f.stat().st_size for f in step_dir.iterdir()),
        "load_average_1m_before": round(load[0], 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
    }


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def run_stop(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kubetrain-stop-")))
        for model in args.stop_models.split(","):
            job_file = scratch / f"{model}.yaml"
            job_file.write_text(yaml.safe_dump(stop_job(model)))
            reps = []
            for rep in range(args.reps):
                run_dir = scratch / f"{model}-{rep}"
                reps.append(one_stop(model, job_file, run_dir))
                print(json.dumps({"model": model, "rep": rep, **reps[-1]}), flush=True)
                shutil.rmtree(run_dir)  # a 100M checkpoint is 1.2 GB
            training = stop_job(model)["spec"]["training"]
            features = training.get("syntheticFeatures", 64)  # digits: 8x8 images
            to_exit = [r["signal_to_nodes_exit_s"] for r in reps]
            results[model] = {
                "training": training,
                "params": mlp_params(features, training["hiddenSize"]),
                "signalled_after_step_record": STOP_MODELS[model][1],
                "reps": len(reps),
                "signal_to_checkpoint_s": _stats([r["signal_to_checkpoint_s"] for r in reps]),
                "signal_to_step_boundary_s": _stats([r["signal_to_step_boundary_s"] for r in reps]),
                "save_s": _stats([r["save_s"] for r in reps]),
                "signal_to_trainers_exit_s": _stats([r["signal_to_trainers_exit_s"] for r in reps]),
                "signal_to_nodes_exit_s": _stats(to_exit),
                "signal_to_command_exit_s": _stats([r["signal_to_command_exit_s"] for r in reps]),
                "checkpoint_mb": round(statistics.median(r["checkpoint_bytes"] for r in reps) / 1e6, 1),
                "step_time_s": _stats([r["step_time_s"] for r in reps]),
                "grace_seconds": DEFAULT_GRACE_SECONDS,
                "grace_over_slowest_nodes_exit": round(DEFAULT_GRACE_SECONDS / max(to_exit), 1),
                "runs": reps,
            }
    return {
        "what": (
            "SIGINT to `kubetrain run --local` (Ctrl-C) mid-epoch -> meta.json of the signal checkpoint "
            "(its mtime) and -> the command's exit; periodic saves off"
        ),
        "models": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="vote,stop", help="comma-separated: vote, stop")
    parser.add_argument("--models", default=",".join(VOTE_MODELS), help="vote part: models to train")
    parser.add_argument("--rounds", type=int, default=60, help="vote part: rounds of the three arms")
    parser.add_argument("--block-seconds", type=float, default=0.3, help="vote part: about this long per block")
    parser.add_argument("--stop-models", default=",".join(STOP_MODELS), help="stop part: jobs to stop")
    parser.add_argument("--reps", type=int, default=5, help="stop part: repetitions per job")
    parser.add_argument("--output", type=Path, default=RESULT, help="result JSON (default: %(default)s)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        vote_worker(args)
        return
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - {"vote", "stop"}) + sorted(
        set(args.models.split(",")) - set(VOTE_MODELS) | set(args.stop_models.split(",")) - set(STOP_MODELS)
    )
    if unknown:
        raise SystemExit(f"unknown part or model: {', '.join(unknown)}")
    report: dict[str, Any] = {
        "benchmark": "stop_on_signal",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_before": [round(v, 2) for v in os.getloadavg()],
    }
    if "vote" in parts:
        report["vote"] = run_vote(args)
    if "stop" in parts:
        report["stop"] = run_stop(args)
    report["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2)[:6000])


if __name__ == "__main__":
    main()
