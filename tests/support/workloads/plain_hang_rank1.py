"""A plain DDP script, written as torch's tutorials write one, importing nothing of kubetrain:
rank 1 blocks outside any collective at step 5, once per checkpoint dir (the marker's place is the
only thing it takes from its environment besides torchrun's). The hang forensics tests run it under
a bare torchrun on 3 nodes; ranks 0 and 2 then wait for rank 1 in step 6's gradient all-reduce."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 12


def block_forever() -> None:
    while True:
        time.sleep(3600)  # the culprit's line: forensics names it


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    marker = Path(os.environ["KUBETRAIN_CHECKPOINT_DIR"]) / "rank1-hung"
    for step in range(1, STEPS + 1):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step == 5 and rank == 1 and not marker.exists():
            marker.write_text("once")
            block_forever()
        time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
