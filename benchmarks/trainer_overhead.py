"""What kubetrain's trainer costs over hand-written PyTorch, measured on this machine.

    .venv/bin/python benchmarks/trainer_overhead.py [--ranks 2] [--reps 5] [--steps 50] [--rounds 10]
    .venv/bin/python benchmarks/trainer_overhead.py --device cuda --ranks 1 --rounds 0 --batch 256 --hidden 4096

Starts `--ranks` processes on 127.0.0.1 with the operator's env contract (gloo, one thread
each; with `--device cuda` NCCL, one GPU each, and the hand loop synchronises the GPU where it
reads its clock, as kubetrain's step records do). The machine is small and shared, so every
comparison is between arms run back to back, and an unrecorded warm-up round comes first:

1. loop overhead: kubetrain's `train()` against a minimal hand-written DDP loop over the same
   model, data, DataLoader, optimizer and schedule, the two alternating run by run. The
   throughput ratio (hand step time / kubetrain step time) compares the 10-step windows
   kubetrain's own step records time with the same windows of the hand loop; the
   end-to-end ratio also charges kubetrain its epoch-end eval and final checkpoint.
2. DDP cost: DDP against a no-communication control (each rank trains its own copy), with
   gradient sync every step and with 4-step `no_sync` accumulation, at a small and a 4x
   larger per-rank batch; the arms alternate in short blocks and each ratio is taken
   between adjacent blocks (CPU only; `--rounds 0` skips it).
3. checkpoint: one collective `Checkpointer.save` of model + AdamW against one step.

Results go to benchmarks/results/trainer_overhead.json (or --output) with the machine described.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ranks import machine, max_over_ranks, spawn

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "trainer_overhead.json"

FEATURES, HIDDEN, BATCH = 256, 1024, 64


def _sizes(args: argparse.Namespace) -> None:
    """--hidden and --batch replace the defaults (in the worker and in the summary)."""
    global HIDDEN, BATCH
    HIDDEN, BATCH = args.hidden, args.batch


def _config(directory: str, steps: int, world: int, backend: str) -> Any:
    from kubetrain.api.training import TrainConfig

    test_fraction = 0.02
    samples = int(steps * BATCH * world / (1 - test_fraction)) + 4 * BATCH * world
    return TrainConfig.model_validate(
        {
            "backend": backend,
            "training": {
                "model": "mlp",
                "dataset": "synthetic",
                "syntheticSamples": samples,
                "syntheticFeatures": FEATURES,
                "hiddenSize": HIDDEN,
                "testFraction": test_fraction,
                "epochs": 1,
                "maxSteps": steps,
                "batchSize": BATCH,
                "learningRate": 1e-3,
                "logEverySteps": 10,
            },
            "checkpoint": {"dir": directory, "keep": 1},
        }
    )


def _kubetrain_run(ctx: Any, directory: str, steps: int) -> dict[str, Any]:
    import torch.distributed as dist

    from kubetrain.api.records import METRICS_FILE
    from kubetrain.trainer.train import train

    config = _config(directory, steps, ctx.world_size, ctx.backend)
    dist.barrier()
    start = time.perf_counter()
    train(config, ctx)
    total = max_over_ranks(time.perf_counter() - start)
    windows: list[float] = []
    if ctx.rank == 0:
        recs = [json.loads(line) for line in (Path(directory) / METRICS_FILE).read_text().splitlines()]
        # Every 10-step window after the first (which holds the first iterator's start-up).
        windows = [r["step_time_s"] for r in recs if r["event"] == "step"][1:]
    return {"total_s": total, "window_step_s": windows}


def _hand_run(ctx: Any, steps: int) -> dict[str, float]:
    """The minimal loop a user would write: same pieces, no checkpoints, logs or eval."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from kubetrain.trainer.data import load_splits, sharded_loader
    from kubetrain.trainer.model import build_model
    from kubetrain.trainer.train import build_optimizer, cosine_schedule

    spec = _config("unused", steps, ctx.world_size, ctx.backend).training
    device, gpu = ctx.device, ctx.device.type == "cuda"
    dist.barrier()
    start = time.perf_counter()
    splits = load_splits(spec)
    loader = sharded_loader(
        splits.train, batch_size=BATCH, rank=ctx.rank, world_size=ctx.world_size, seed=spec.seed, pin_memory=gpu
    )
    torch.manual_seed(spec.seed)
    module = build_model(spec, splits.input_shape, splits.num_classes).to(device)
    model = DDP(module, device_ids=[ctx.local_rank] if gpu else None, gradient_as_bucket_view=True)
    optimizer = build_optimizer(spec, model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_schedule(steps))
    batches = loader.epoch(0)
    windows = []
    mark = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = next(batches)
        F.cross_entropy(model(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:  # the same 10-step windows kubetrain's records time
            if gpu:
                torch.cuda.synchronize(device)  # kubetrain's window ends in a read of the loss
            now = time.perf_counter()
            if step > 10:
                windows.append((now - mark) / 10)
            mark = now
    total = max_over_ranks(time.perf_counter() - start)
    return {"total_s": total, "window_step_s": windows}


# Per-rank batch sizes of the DDP-cost arms: the first matches the loop comparison (a small,
# communication-heavy step), the second is a compute-heavier step of the same model.
COMM_BATCHES = (BATCH, 4 * BATCH)


def _comm_rounds(ctx: Any, *, rounds: int, block: int) -> dict[str, list[float]]:
    """Seconds per timed block for eight arms, alternated block by block.

    Arms: DDP or no communication at all (each rank trains its own copy), syncing every
    step or accumulating 4 micro-steps under no_sync, at each batch size of COMM_BATCHES.
    A block is `block` micro-batches at the small batch and proportionally fewer at the
    larger one (about the same seconds). Adjacent blocks see the same machine load, so
    their ratio is the stable quantity on a shared machine.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from kubetrain.trainer.model import MLP
    from kubetrain.trainer.train import accumulate_gradients

    gen = torch.Generator().manual_seed(ctx.rank)
    arms = {}
    for batch in COMM_BATCHES:
        data = [
            (torch.randn(batch, FEATURES, generator=gen), torch.randint(0, 10, (batch,), generator=gen))
            for _ in range(4)
        ]
        micro = max(4, block * BATCH // batch // 4 * 4)
        for accum in (4, 1):
            for ddp in (True, False):
                torch.manual_seed(0)
                module = MLP(FEATURES, HIDDEN, 10)
                model = DDP(module, gradient_as_bucket_view=True) if ddp else module
                name = f"{'ddp' if ddp else 'control'}_accum{accum}_batch{batch}"
                arms[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3), accum, data, micro)
    times: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    for round_ in range(rounds + 1):  # round 0 warms every arm up and is not recorded
        for name in names if round_ % 2 == 0 else names[::-1]:
            model, optimizer, accum, data, micro = arms[name]
            batches = (data[i % len(data)] for i in range(micro))
            dist.barrier()
            start = time.perf_counter()
            for _ in range(micro // accum):
                accumulate_gradients(model, batches, accum)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            elapsed = max_over_ranks(time.perf_counter() - start)
            if round_ > 0:
                times[name].append(elapsed)
    return times


def _checkpoint_run(ctx: Any, directory: str) -> float:
    import torch
    import torch.distributed as dist

    from kubetrain.trainer.checkpoint import Checkpointer
    from kubetrain.trainer.model import MLP

    module = MLP(FEATURES, HIDDEN, 10).to(ctx.device)
    optimizer = torch.optim.AdamW(module.parameters())
    module(torch.randn(2, FEATURES, device=ctx.device)).sum().backward()
    optimizer.step()  # AdamW state exists, as in a real save
    ckpt = Checkpointer(directory, rank=ctx.rank, world_size=ctx.world_size, keep=1)
    times = []
    for step in range(5):
        dist.barrier()
        start = time.perf_counter()
        ckpt.save(step, {"model": module.state_dict(), "optimizer": optimizer.state_dict()})
        dist.barrier()  # rank 0 alone writes; the others wait, as at their next collective
        times.append(max_over_ranks(time.perf_counter() - start))
    return statistics.median(times)


def worker(args: argparse.Namespace) -> None:
    import torch

    from kubetrain.runtime.worker import dist as kdist
    from kubetrain.runtime.worker.metrics import configure_logging
    from kubetrain.trainer.checkpoint import complete_checkpoints

    _sizes(args)
    backend = "nccl" if args.device == "cuda" else "gloo"
    if backend == "gloo":
        torch.set_num_threads(1)
    # On success the ranks meet before tearing down: a rank that exits while its peers still
    # hold gloo connections can abort at interpreter exit.
    with kdist.distributed(backend, timeout_s=600, connect_timeout_s=60) as ctx:
        configure_logging(ctx.rank)
        # The trainer's rank-0 records would go to stdout: this worker reports through --out only.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
        results: dict[str, Any] = {"loop": [], "comm": {}, "checkpoint": {}}
        base = Path(args.scratch)
        # One unrecorded round first: the first call of each path pays one-time costs
        # (lazy imports, first DDP construction, first torch.save) of several seconds.
        _kubetrain_run(ctx, str(base / "warmup"), 20)
        _hand_run(ctx, 20)
        for rep in range(args.reps):
            pair: dict[str, Any] = {}
            for arm in ("kubetrain", "hand") if rep % 2 == 0 else ("hand", "kubetrain"):
                if arm == "kubetrain":
                    pair[arm] = _kubetrain_run(ctx, str(base / f"rep{rep}"), args.steps)
                else:
                    pair[arm] = _hand_run(ctx, args.steps)
            results["loop"].append(pair)
        if args.rounds > 0:
            results["comm"] = _comm_rounds(ctx, rounds=args.rounds, block=args.block)
        results["checkpoint"]["save_s"] = _checkpoint_run(ctx, str(base / "ckpt"))
        if ctx.rank == 0:
            path = complete_checkpoints(base / "ckpt")[-1][1]
            results["checkpoint"]["bytes"] = sum(f.stat().st_size for f in path.iterdir())
            Path(args.out).write_text(json.dumps(results))


def _machine(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    described = machine()
    if args.device == "cuda":
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible"
        described.update(backend="nccl", gpu=gpu, cuda=torch.version.cuda)
    return {
        **described,
        "note": (
            "shared machine: other work ran alongside; compare arms within a repetition, not across runs. "
            "One unrecorded warm-up round of every arm precedes the repetitions."
        ),
    }


def _ratios(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in zip(num, den, strict=True)]


def _summary(raw: dict[str, Any], args: argparse.Namespace, wall: float, load: tuple[float, ...]) -> dict[str, Any]:
    med = statistics.median
    loop = raw["loop"]
    # Per repetition: median 10-step window of the hand loop over kubetrain's (throughput ratio).
    steady = [med(p["hand"]["window_step_s"]) / med(p["kubetrain"]["window_step_s"]) for p in loop]
    end_to_end = [p["hand"]["total_s"] / p["kubetrain"]["total_s"] for p in loop]
    kt_windows = [w for p in loop for w in p["kubetrain"]["window_step_s"]]
    hand_windows = [w for p in loop for w in p["hand"]["window_step_s"]]
    comm = raw["comm"]
    ddp_cost: dict[str, Any] = {
        "what": "throughput of DDP over a no-communication control (control time / DDP time), adjacent blocks",
        "target_no_sync_accum4": 0.95,
    }
    for batch in COMM_BATCHES if comm else ():
        for accum, label in ((1, "sync_every_step"), (4, "no_sync_accum4")):
            ratios = _ratios(comm[f"control_accum{accum}_batch{batch}"], comm[f"ddp_accum{accum}_batch{batch}"])
            ddp_cost[f"batch{batch}_{label}_median"] = round(med(ratios), 4)
            ddp_cost[f"batch{batch}_{label}_per_round"] = [round(r, 4) for r in ratios]
    step_s = med(kt_windows)
    save_s = raw["checkpoint"]["save_s"]
    model_params = FEATURES * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * 10 + 10

    def r4(values: list[float]) -> list[float]:
        return [round(v, 4) for v in values]

    return {
        "benchmark": "trainer_overhead",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {**_machine(args), "load_average_before": load, "load_average_after": os.getloadavg()},
        "setup": {
            "ranks": args.ranks,
            "loop_reps": args.reps,
            "steps_per_loop_run": args.steps,
            "comm_rounds": args.rounds,
            "micro_batches_per_comm_block": args.block,
            "comm_batches_per_rank": list(COMM_BATCHES),
            "model": f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-10 ({model_params} params, AdamW)",
            "batch_per_rank": BATCH,
            "wall_s": round(wall, 1),
        },
        "loop_vs_hand": {
            "what": "throughput of kubetrain's train() over a hand-written DDP loop (hand step time / kubetrain's)",
            "steady_ratio_median_of_reps": round(med(steady), 4),
            "steady_ratio_per_rep": r4(steady),
            "steady_ratio_of_fastest_windows": round(min(hand_windows) / min(kt_windows), 4),
            "end_to_end_ratio_median_of_reps": round(med(end_to_end), 4),
            "end_to_end_ratio_per_rep": r4(end_to_end),
            "end_to_end_note": "kubetrain's end to end includes its epoch-end eval and a final checkpoint",
            "target": 0.98,
        },
        "ddp_vs_no_communication": ddp_cost if comm else "not measured (--rounds 0)",
        "checkpoint": {
            "save_ms_median": round(save_s * 1000, 2),
            "step_ms_median": round(step_s * 1000, 2),
            "save_over_step": round(save_s / step_s, 2),
            "bytes": raw["checkpoint"]["bytes"],
        },
        "raw": raw,
    }


def launch(args: argparse.Namespace) -> None:
    load = os.getloadavg()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kubetrain-bench-") as scratch:
        out = Path(scratch) / "raw.json"
        argv = ["--worker", "--out", str(out), "--scratch", scratch]
        argv += ["--reps", str(args.reps), "--steps", str(args.steps)]
        argv += ["--rounds", str(args.rounds), "--block", str(args.block), "--device", args.device]
        argv += ["--hidden", str(args.hidden), "--batch", str(args.batch)]
        spawn(__file__, argv, args.ranks)
        summary = _summary(json.loads(out.read_text()), args, time.monotonic() - start, load)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "raw"}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=10, help="alternations of the DDP/control arms")
    parser.add_argument("--block", type=int, default=24, help="micro-batches per timed block at the small batch")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL, one GPU per rank")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="the MLP's hidden width")
    parser.add_argument("--batch", type=int, default=BATCH, help="samples per rank and step")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, default=RESULT, help="result JSON (default: %(default)s)")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and args.ranks != 1 and not args.worker:
        parser.error("--device cuda runs one rank: its ranks would share GPU 0, which NCCL refuses")
    _sizes(args)
    if args.worker:
        worker(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
