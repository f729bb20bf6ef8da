"""One rank of the shard and accumulation checks; rank 0 prints one JSON result line.

Run once per rank with the env contract (see conftest.Launcher). Uses the trainer's own
pieces: dist.distributed, data.sharded_loader on the digits training split, accumulate_gradients.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset

from kubetrain.api.training import TrainingSpec
from kubetrain.runtime.worker import dist as kdist
from kubetrain.trainer.data import load_splits, sharded_loader
from kubetrain.trainer.model import MLP
from kubetrain.trainer.train import accumulate_gradients


def shard_check(rank: int, world: int) -> dict[str, Any]:
    train = load_splits(TrainingSpec(dataset="digits", seed=3)).train
    indexed = TensorDataset(torch.arange(len(train)))
    loader = sharded_loader(indexed, batch_size=16, rank=rank, world_size=world, seed=3, drop_last=False)
    epochs = []
    for epoch in range(2):
        mine = torch.cat([batch for (batch,) in loader.epoch(epoch)]).tolist()
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, mine)
        epochs.append(everyone)
    return {"dataset_size": len(train), "epochs": epochs}


def accumulation_check(rank: int, k: int = 4, batch: int = 8) -> dict[str, Any]:
    torch.manual_seed(0)
    model = DDP(MLP(64, 32, 10, dropout=0.0))
    calls = [0]

    # No `from __future__ import annotations` here: DDP checks this annotation at runtime.
    def counting_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        calls[0] += 1
        tensor = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])

    model.register_comm_hook(None, counting_hook)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data, as in training
    x = torch.randn(k * batch, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (k * batch,), generator=gen)

    micro = iter(zip(x.split(batch), y.split(batch), strict=True))
    accumulate_gradients(model, micro, k)
    accumulated = [p.grad.clone() for p in model.parameters()]
    accumulated_calls = calls[0]
    model.zero_grad(set_to_none=True)

    calls[0] = 0
    F.cross_entropy(model(x), y).backward()
    big = [p.grad.clone() for p in model.parameters()]
    max_diff = max((a - b).abs().max().item() for a, b in zip(accumulated, big, strict=True))
    return {"max_abs_diff": max_diff, "accumulated_allreduce_calls": accumulated_calls, "big_batch_calls": calls[0]}


# Thread names of c10d: gloo's gloo_tcp_loop and pt_gloo_runloop, the store's pt_tcpstore_uv, NCCL's
# pt_nccl_*. Not others: a machine with a GPU driver or jemalloc runs threads of its own (an H200's
# torch 2.11 had cuda0000680001b and jemalloc_bg_thd).
C10D_THREADS = ("gloo", "pt_")


def threads() -> list[str]:
    """Names of this process's threads."""
    return sorted(Path(f"/proc/self/task/{tid}/comm").read_text().strip() for tid in os.listdir("/proc/self/task"))


def main() -> None:
    torch.set_num_threads(1)
    # On success the ranks meet before tearing down (as the trainer does), with DDP used.
    with kdist.distributed("gloo", timeout_s=60, connect_timeout_s=60) as ctx:
        result = {"shards": shard_check(ctx.rank, ctx.world_size), "accumulation": accumulation_check(ctx.rank)}
        diffs: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(diffs, result["accumulation"])
        result["accumulation"] = diffs
    # Teardown left nothing of c10d running into interpreter shutdown (every rank checks itself).
    result["threads_after_teardown"] = [name for name in threads() if name.startswith(C10D_THREADS)]
    if result["threads_after_teardown"]:
        sys.exit(f"rank {ctx.rank}: threads still running after teardown: {result['threads_after_teardown']}")
    if ctx.rank == 0:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
