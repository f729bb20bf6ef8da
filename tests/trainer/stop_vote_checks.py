"""One rank of the stop-vote checks; rank 0 prints one JSON result line.

Run once per rank with the env contract (support.trainer_runs.Launcher). Counts the all_reduces
`StopSignal.agreed()` starts at two step lengths, then signals rank 1 mid-loop and records at
which call each rank's `agreed()` turned true.
"""

import json
import os
import signal
import time
import types
from typing import Any

import torch
import torch.distributed as dist

from kubetrain.runtime.worker import dist as kdist
from kubetrain.runtime.worker import stopping
from kubetrain.runtime.worker.stopping import StopSignal

STEPS = 200


def votes_per_step(ctx: kdist.DistContext, step_s: float, steps: int) -> float:
    """all_reduces started per `agreed()` call over `steps` steps of exactly `step_s`, on a clock
    this check moves: the spacing rule is under test, not how fast a loaded machine sleeps (a
    1 ms sleep that took 60 ms would have made the fast steps vote 4 times as often)."""
    started = [0]
    all_reduce = dist.all_reduce
    clock = [time.monotonic()]

    def counting(*args: Any, **kwargs: Any) -> Any:
        started[0] += 1
        return all_reduce(*args, **kwargs)

    stopping.dist.all_reduce = counting  # type: ignore[attr-defined]
    stopping.time = types.SimpleNamespace(monotonic=lambda: clock[0])  # type: ignore[attr-defined]
    try:
        stop = StopSignal(ctx)
        for _ in range(steps):
            clock[0] += step_s
            assert not stop.agreed()
        stop.close()
    finally:
        stopping.dist.all_reduce = all_reduce  # type: ignore[attr-defined]
        stopping.time = time  # type: ignore[attr-defined]
    return started[0] / steps


def stop_call(ctx: kdist.DistContext, signal_at: int) -> dict[str, float]:
    """Fast steps; rank 1 gets SIGTERM before step `signal_at`: the call at which agreed() turned true."""
    stop = StopSignal(ctx)
    signalled = time.monotonic()
    for call in range(1, 10 * STEPS):
        if call == signal_at and ctx.rank == 1:
            signalled = time.monotonic()
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.001)
        if stop.agreed():
            return {"call": call, "after_signal_s": time.monotonic() - signalled}
    raise AssertionError(f"rank {ctx.rank}: no stop agreed within {10 * STEPS} steps")


def stop_after_slowdown(ctx: kdist.DistContext, fast: int, slow_s: float) -> int:
    """`fast` 1 ms steps, then steps of `slow_s` with rank 1 signalled at the first: how many
    calls after the signal agreed() turned true (the spacing fitted to the fast steps must not
    make the slow ones wait for it)."""
    stop = StopSignal(ctx)
    for call in range(1, fast + 200):
        slow = call > fast
        if call == fast + 1 and ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(slow_s if slow else 0.001)
        if stop.agreed():
            return call - fast
    raise AssertionError(f"rank {ctx.rank}: no stop agreed within 200 slow steps")


def main() -> None:
    torch.set_num_threads(1)
    with kdist.distributed("gloo", timeout_s=60, connect_timeout_s=60) as ctx:
        result = {
            "fast": votes_per_step(ctx, 0.001, STEPS),
            "slow": votes_per_step(ctx, 2 * stopping.VOTE_INTERVAL_S, 12),
            "stop": stop_call(ctx, 100),
            "after_slowdown": stop_after_slowdown(ctx, 150, 0.05),
        }
        everyone: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(everyone, result)
    if ctx.rank == 0:
        print(json.dumps(everyone))


if __name__ == "__main__":
    main()
