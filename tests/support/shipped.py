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


def kubeflow_ddp(epochs: int) -> None:
    """A function as Kubeflow Trainer's SDK documents one (its `train_pytorch` example), with a
    tiny model and synthetic data in place of Fashion-MNIST: it initialises the process group
    itself, shards with DistributedSampler, trains with DDP, then meets and destroys the group."""
    import os

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    device, backend = ("cuda", "nccl") if torch.cuda.is_available() else ("cpu", "gloo")
    dist.init_process_group(backend=backend)

    local_rank = int(os.getenv("LOCAL_RANK", 0))
    print(
        "Distributed Training with WORLD_SIZE: {}, RANK: {}, LOCAL_RANK: {}.".format(  # noqa: UP032  (Kubeflow's words)
            dist.get_world_size(), dist.get_rank(), local_rank
        )
    )

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.fc2 = nn.Linear(16, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)

    device = torch.device(f"{device}:{local_rank}")
    model = nn.parallel.DistributedDataParallel(Net().to(device))
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 8, generator=generator)
    dataset = TensorDataset(inputs, (inputs.sum(dim=1) > 0).long())
    train_loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))

    for epoch in range(epochs):
        for batch_idx, (batch, labels) in enumerate(train_loader):
            batch, labels = batch.to(device), labels.to(device)
            outputs = model(batch)
            loss = F.nll_loss(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if batch_idx % 2 == 0 and dist.get_rank() == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(batch)}/{len(dataset)}] Loss: {loss.item():.4f}")

    dist.barrier()
    if dist.get_rank() == 0:
        print("Training is finished")
    dist.destroy_process_group()


def adopts_its_own_group() -> None:
    """Initialises the process group itself, then asks kubetrain for its context (the runner's
    final meeting ends it: the group is left initialised)."""
    dist.init_process_group(backend="gloo")
    ctx = lib.context()
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    print(f"adopted: rank {ctx.rank} of {ctx.world_size} on {ctx.backend}, sum {total.item():g}", flush=True)


def fails_differently() -> None:
    """Fails as a lost peer does: a message that is never the same twice."""
    import os

    raise RuntimeError(f"Connection closed by peer [10.0.0.7]:{os.getpid()}")
