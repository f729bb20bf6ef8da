"""A user's own DDP script, as pytorch/examples' multinode.py is written: the BYO workload of
benchmarks/teardown_stress.py. It imports nothing from kubetrain and is run by a bare
`torchrun` that reads the PET_* variables, so whatever makes its teardown clean has to come
from the launch contract, not from this file.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 64, generator=generator)
        y = torch.randint(0, 10, (32,), generator=generator)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f} (pid {os.getpid()})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
