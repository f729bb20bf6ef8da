"""A DDP script of your own (kubetrain.trainer.lib) whose rank 1 blocks outside any collective at
step 5, once per checkpoint dir: the hang forensics tests run it under a bare torchrun on 3 nodes.
Ranks 0 and 2 then wait for rank 1 in the gradient all-reduce of step 6's backward."""

import os
import time
from pathlib import Path

import torch
from torch import nn

from kubetrain.trainer import lib

STEPS = 12


def block_forever() -> None:
    while True:
        time.sleep(3600)  # the culprit's line: forensics names it


def main() -> None:
    with lib.distributed() as ctx:
        watchdog = lib.HangWatchdog(ctx.local_rank)
        torch.manual_seed(0)
        model = lib.DDP(nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        marker = Path(os.environ["KUBETRAIN_CHECKPOINT_DIR"]) / "rank1-hung"
        lib.log0(ctx, "start", step=0, epoch=0, total_steps=STEPS, world_size=ctx.world_size, backend=ctx.backend)
        loss = torch.zeros(())
        for step in range(1, STEPS + 1):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            watchdog.beat()
            lib.log0(ctx, "step", step=step, epoch=0, loss=float(loss))
            if step == 5 and ctx.rank == 1 and not marker.exists():
                marker.write_text("once")
                block_forever()
            time.sleep(0.1)
        watchdog.stop()
        lib.log0(ctx, "done", step=STEPS, epoch=0, loss=float(loss))


if __name__ == "__main__":
    main()
