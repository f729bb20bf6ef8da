"""Preflight: every collective across the whole world, checked, plus all_reduce bus bandwidth.

Run it before a long job (`training.preflight: true`, or `torchrun -m kubetrain.trainer
preflight`) so a broken NIC, a wrong WORLD_SIZE or a firewalled port fails in seconds with
the rank and operation named, instead of as a hang an hour in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from kubetrain.runtime.worker.dist import DistContext

# all_reduce sizes for the bandwidth probe (bytes of float32).
BANDWIDTH_SIZES = (64 * 1024, 1024 * 1024, 16 * 1024 * 1024)


class PreflightError(RuntimeError):
    """One or more ranks saw a wrong result; the message names each rank and operation."""


def _expect(name: str, got: torch.Tensor, want: torch.Tensor) -> str | None:
    if got.shape == want.shape and torch.equal(got.cpu(), want.cpu()):
        return None
    return f"{name}: got {got.cpu().tolist()}, expected {want.cpu().tolist()}"


def _checks(ctx: DistContext) -> list[tuple[str, Callable[[], str | None], str]]:
    """(operation, check returning an error or None, note) for this world."""
    rank, world, device = ctx.rank, ctx.world_size, ctx.device

    def t(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device)

    def broadcast() -> str | None:
        errors = []
        for src in sorted({0, world - 1}):
            buf = t([src * 10.0 + 1, 2.0]) if rank == src else t([-1.0, -1.0])
            dist.broadcast(buf, src=src)
            errors.append(_expect(f"broadcast from rank {src}", buf, t([src * 10.0 + 1, 2.0])))
        return "; ".join(e for e in errors if e) or None

    def all_reduce() -> str | None:
        buf = t([rank + 1.0, 1.0])
        dist.all_reduce(buf)
        return _expect("all_reduce", buf, t([world * (world + 1) / 2, float(world)]))

    def all_gather() -> str | None:
        out = [t([-1.0]) for _ in range(world)]
        dist.all_gather(out, t([float(rank)]))
        return _expect("all_gather", torch.cat(out), t([float(r) for r in range(world)]))

    def reduce_scatter() -> str | None:
        # Chunk r of rank q holds q*world + r; chunk r of the sum is sum_q (q*world + r).
        want = t([sum(q * world + rank for q in range(world))])
        inputs = [t([float(rank * world + r)]) for r in range(world)]
        out = t([-1.0])
        if ctx.backend == "gloo":
            full = torch.cat(inputs)
            dist.all_reduce(full)
            out = full[rank : rank + 1]
        else:
            dist.reduce_scatter(out, inputs)
        return _expect("reduce_scatter", out, want)

    def gather() -> str | None:
        out = [t([-1.0]) for _ in range(world)] if rank == 0 else None
        dist.gather(t([rank * 2.0]), out, dst=0)
        if out is None:
            return None
        return _expect("gather to rank 0", torch.cat(out), t([r * 2.0 for r in range(world)]))

    def scatter() -> str | None:
        out = t([-1.0])
        dist.scatter(out, [t([r * 3.0]) for r in range(world)] if rank == 0 else None, src=0)
        return _expect("scatter from rank 0", out, t([rank * 3.0]))

    def ring() -> str | None:
        if world == 1:
            return None
        got = t([-1.0])
        ops = [
            dist.P2POp(dist.isend, t([float(rank)]), (rank + 1) % world),
            dist.P2POp(dist.irecv, got, (rank - 1) % world),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return _expect(f"send/recv ring (from rank {(rank - 1) % world})", got, t([float((rank - 1) % world)]))

    gloo_note = "gloo has no reduce_scatter: emulated with all_reduce + slice" if ctx.backend == "gloo" else ""
    return [
        ("broadcast", broadcast, ""),
        ("all_reduce", all_reduce, ""),
        ("all_gather", all_gather, ""),
        ("reduce_scatter", reduce_scatter, gloo_note),
        ("gather", gather, ""),
        ("scatter", scatter, ""),
        ("send_recv_ring", ring, "skipped: world of one" if world == 1 else ""),
    ]


def _sync(ctx: DistContext) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def bus_bandwidth(ctx: DistContext, sizes: tuple[int, ...] = BANDWIDTH_SIZES, iters: int = 5) -> list[dict[str, Any]]:
    """all_reduce bus bandwidth per size, nccl-tests style: busbw = 2(n-1)/n x size / time.

    The time is the slowest rank's mean over `iters` after one warm-up.
    """
    world = ctx.world_size
    results = []
    for size in sizes:
        buf = torch.ones(size // 4, dtype=torch.float32, device=ctx.device)
        dist.all_reduce(buf)
        _sync(ctx)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        _sync(ctx)
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        seconds = float(elapsed.item())
        algbw = size / seconds / 1e9
        results.append(
            {
                "bytes": size,
                "time_us": round(seconds * 1e6, 1),
                "algbw_gbps": round(algbw, 4),
                "busbw_gbps": round(algbw * 2 * (world - 1) / world, 4),
            }
        )
    return results


def run_preflight(ctx: DistContext, *, bandwidth: bool = True) -> dict[str, Any]:
    """Run every check on every rank; raise PreflightError naming each failing rank and op.

    Returns {"ok", "world_size", "backend", "ops": [{"op", "ok", "note"}], "bandwidth": [...]}.
    All ranks run every operation in the same order (even after a failure), so a wrong
    result on one rank never turns into a hang on another.
    """
    ops = []
    failures = []
    for name, check, note in _checks(ctx):
        try:
            error = check()
        except Exception as exc:  # a collective that raises is a failed check, with its message
            error = f"{name} raised {type(exc).__name__}: {exc}"
        mine = f"rank {ctx.rank}: {error}" if error else None
        everyone: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(everyone, mine)
        bad = [entry for entry in everyone if entry]
        failures.extend(bad)
        ops.append({"op": name, "ok": not bad, "note": note})
    if failures:
        raise PreflightError("preflight failed: " + "; ".join(failures))
    result: dict[str, Any] = {"ok": True, "world_size": ctx.world_size, "backend": ctx.backend, "ops": ops}
    if bandwidth and ctx.world_size > 1:
        result["bandwidth"] = bus_bandwidth(ctx)
    return result
