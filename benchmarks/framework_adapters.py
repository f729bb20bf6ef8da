"""What kubetrain's runtime costs a script that never imported it, per optimizer step.

    .venv/bin/python benchmarks/framework_adapters.py [--ranks 2] [--reps 5] [--steps 60]

Two comparisons, each between arms that alternate in one run (the order flips every repeat) on
`--ranks` gloo processes on 127.0.0.1, marked as torchrun workers (TORCHELASTIC_RUN_ID) so the
runtime acts as it does under torchrun:

1. Hugging Face `Trainer` (a tiny GPT-2 from its config, synthetic tokens, logging every 10
   steps, no saves): with kubetrain's adapter (kubetrain.runtime.guest.hf_adapter: records, the stop
   vote at every step end, watchdog beats) against the same Trainer with the adapter's callback
   removed.
2. A plain DDP loop (SGD on an MLP): kubetrain.runtime.guest.step_watch's optimizer-step hook
   (watchdog beat, rank 0's throttled records) on and off in alternate 10-step blocks of one
   loop, each on block against the off block before it; and the hook's own cost per call.

The Trainer's time per step is taken between step 10 and the last step (the first steps hold
start-up); every time is the slowest rank's. Results: benchmarks/results/framework_adapters.json (or --output).
"""

from __future__ import annotations

import argparse
import itertools
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
RESULT = ROOT / "benchmarks" / "results" / "framework_adapters.json"
WARM_STEPS = 10


def _hf_arm(adapter: bool, steps: int, directory: str) -> float:
    import torch
    from torch.utils.data import TensorDataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from kubetrain.runtime.guest.hf_adapter import Adapter

    marks: dict[int, float] = {}

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step in (WARM_STEPS, steps):
                marks[state.global_step] = time.perf_counter()

    tokens = torch.randint(0, 128, (4096, 32), generator=torch.Generator().manual_seed(0))

    class Tokens(TensorDataset):
        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"input_ids": tokens[index], "labels": tokens[index]}

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32)
    arguments = TrainingArguments(
        output_dir=directory,
        use_cpu=True,
        report_to=[],
        per_device_train_batch_size=8,
        max_steps=steps,
        save_strategy="no",
        logging_steps=10,
        disable_tqdm=True,
    )
    trainer = Trainer(model=GPT2LMHeadModel(config), args=arguments, train_dataset=Tokens(tokens), callbacks=[Clock()])
    if not adapter:
        for callback in list(trainer.callback_handler.callbacks):
            if isinstance(callback, Adapter):
                trainer.remove_callback(callback)
    trainer.train()
    return max_over_ranks((marks[steps] - marks[WARM_STEPS]) / (steps - WARM_STEPS))


def _plain_blocks(steps: int, block: int = 10) -> dict[str, float]:
    """One plain DDP loop whose hook is on and off in alternate blocks of `block` steps (adjacent
    blocks see the same load): the median ratio of an on block to the off block before it, the
    median step times, and what the hook itself costs per call on rank 0."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from kubetrain.runtime.guest import step_watch

    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    times: list[tuple[bool, float]] = []
    dist.barrier()
    for index in range(steps // block):
        hooked = index % 2 == 1
        handle = register_optimizer_step_post_hook(step_watch._stepped) if hooked else None
        start = time.perf_counter()
        for _ in range(block):
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        times.append((hooked, max_over_ranks((time.perf_counter() - start) / block)))
        if handle is not None:
            handle.remove()
    pairs = [on / off for (was, off), (now, on) in itertools.pairwise(times) if now and not was]
    calls = 20000
    start = time.perf_counter()
    for _ in range(calls):
        step_watch._stepped(optimizer, (), {})
    return {
        "ratio": statistics.median(pairs[1:]),  # the first pair holds the warm-up
        "with_step_s": statistics.median(t for on, t in times[2:] if on),
        "without_step_s": statistics.median(t for on, t in times[2:] if not on),
        "hook_call_s": (time.perf_counter() - start) / calls,
    }


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import transformers.trainer

    from kubetrain.runtime.guest import hf_adapter, step_watch

    torch.set_num_threads(1)
    hf_adapter.install(transformers.trainer)
    # The Trainer's adapter counts as a script reporting for itself; the plain loop's arm is the
    # case of a script that does not (what step_watch decides from sys.modules under torchrun).
    step_watch.SELF_REPORTING = ()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as directory:
        for rep in range(args.reps + 1):  # rep 0: the unrecorded warm-up
            order = (False, True) if rep % 2 else (True, False)
            for on in order:
                hf = _hf_arm(on, args.steps, directory)
                if rep:
                    rows.append({"rep": rep, "adapter": on, "step_s": hf})
    plain = _plain_blocks(args.plain_steps)
    if dist.get_rank() == 0:
        Path(args.rows).write_text(json.dumps({"hf": rows, "plain": plain}))
    dist.destroy_process_group()


def _summary(hf_rows: list[dict[str, Any]], plain: dict[str, float]) -> dict[str, Any]:
    on = {r["rep"]: r["step_s"] for r in hf_rows if r["adapter"]}
    off = {r["rep"]: r["step_s"] for r in hf_rows if not r["adapter"]}
    ratios = [on[rep] / off[rep] for rep in sorted(on)]
    return {
        "hf_trainer": {
            "with_adapter_ms_median": round(statistics.median(on.values()) * 1000, 3),
            "without_ms_median": round(statistics.median(off.values()) * 1000, 3),
            "ratio_per_rep": [round(r, 4) for r in ratios],
            "ratio_median": round(statistics.median(ratios), 4),
        },
        "plain_ddp_step_watch": {
            "with_ms_median": round(plain["with_step_s"] * 1000, 3),
            "without_ms_median": round(plain["without_step_s"] * 1000, 3),
            "ratio_adjacent_blocks_median": round(plain["ratio"], 4),
            "hook_us_per_step": round(plain["hook_call_s"] * 1e6, 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--plain-steps", type=int, default=2000)
    parser.add_argument("--output", type=Path, default=RESULT)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rows", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.steps <= WARM_STEPS:
        parser.error(f"--steps must be over {WARM_STEPS}")
    os.environ["TORCHELASTIC_RUN_ID"] = "framework-adapters-benchmark"
    with tempfile.TemporaryDirectory() as scratch:
        rows_file = Path(scratch) / "rows.json"
        argv = ["--worker", "--rows", str(rows_file), "--reps", str(args.reps), "--steps", str(args.steps)]
        argv += ["--plain-steps", str(args.plain_steps)]
        started = time.time()
        spawn(__file__, argv, args.ranks)
        rows = json.loads(rows_file.read_text())
    result = {
        "benchmark": "framework_adapters",
        "args": {"ranks": args.ranks, "reps": args.reps, "steps": args.steps, "plain_steps": args.plain_steps},
        "machine": machine(),
        "wall_s": round(time.time() - started, 1),
        "rows": rows,
        "summary": _summary(rows["hf"], rows["plain"]),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2), file=sys.stderr)


if __name__ == "__main__":
    main()
