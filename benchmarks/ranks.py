"""What the multi-rank CPU benchmarks share: rank processes started on 127.0.0.1 with the
operator's env contract (gloo, one thread each), a max over ranks, and the machine described.

A benchmark script re-runs itself as each rank (`spawn(__file__, [..., "--worker"], ranks)`);
its worker enters `kubetrain.runtime.worker.dist.distributed("gloo")` as a pod's process would.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def spawn(script: str, argv: list[str], ranks: int) -> None:
    """Run `python script *argv` as `ranks` ranks of one gloo job on 127.0.0.1 and wait for all;
    SystemExit naming the exit codes when any rank fails."""
    from kubetrain.api import contract

    port = contract.free_port()
    procs = []
    for rank in range(ranks):
        env = {k: v for k, v in os.environ.items() if k not in contract.RESERVED_ENV}
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        env.update(
            contract.rendezvous_env(
                master_addr="127.0.0.1", master_port=port, nnodes=ranks, node_rank=rank, nproc_per_node=1
            )
        )
        procs.append(subprocess.Popen([sys.executable, script, *argv], env=env))
    codes = [proc.wait() for proc in procs]
    if any(codes):
        raise SystemExit(f"benchmark workers failed: exit codes {codes}")


def max_over_ranks(value: float) -> float:
    """The largest `value` of all ranks (collective): a step is as slow as its slowest rank."""
    import torch
    import torch.distributed as dist

    nccl = dist.get_backend() == "nccl"  # it reduces GPU tensors only
    t = torch.tensor([value], dtype=torch.float64, device="cuda" if nccl else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def machine() -> dict[str, Any]:
    """The CPU, Python and torch of this run (torch is imported: call it from a worker or after the runs)."""
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads_per_rank": 1,
        "backend": "gloo",
    }
