"""The functions the tests ship (kubetrain.client.ship: each goes by its source, with what it
reads from this module, its imports as imports): the client's 2-node runs
(tests/client/test_client_*.py) and the runner's world of one (tests/trainer/test_function_runner.py)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from kubetrain.trainer import lib

STEPS = 3


def summed(offset: int) -> tuple[Any, float]:
    """Every rank contributes rank + offset to an all-reduce: this rank's context and the sum."""
    ctx = lib.context()
    total = torch.tensor([float(ctx.rank + offset)])
    dist.all_reduce(total)
    return ctx, total.item()


def log_steps(ctx: Any) -> None:
    """Rank 0 logs STEPS step records."""
    for step in range(1, STEPS + 1):
        lib.log0(ctx, "step", step=step, epoch=0, total_steps=STEPS, loss=1.0 / step)


def all_reduce_ranks(offset: int) -> None:
    """Each rank prints its part and the sum; rank 0 logs records."""
    ctx, total = summed(offset)
    print(f"rank {ctx.rank} of {ctx.world_size}: {ctx.rank + offset} -> sum {total:g}", flush=True)
    log_steps(ctx)


def reports(tag: str) -> None:
    """Each rank prints `tag`, where it runs and the sum of rank + 1; rank 0 logs records."""
    ctx, total = summed(1)
    print(f"{tag}: rank {ctx.rank} of {ctx.world_size} on {ctx.backend}, sum {total}", flush=True)
    log_steps(ctx)


def fails(message: str) -> None:
    raise ValueError(message)


def raises(message: str) -> None:
    raise ValueError(message)
