"""A script of a user's own on kubetrain.trainer.lib's data contract (docs/trainer.md, "Your own
script"): one global batch at any world size, a resume at another size, and the survivor's save
when a peer dies. `--kill-at N` makes the last rank SIGKILL itself after step N (a lost pod).

    torchrun --nproc-per-node 3 lib_resizable.py --dir /tmp/ck [--kill-at 7]
"""

from __future__ import annotations

import argparse
import os
import signal
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from kubetrain.trainer import lib


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--kill-at", type=int, default=0)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(240, 16, generator=generator)
    data = TensorDataset(x, (x.sum(dim=1) > 0).long())

    with lib.distributed() as ctx:
        loader = lib.CursorLoader(data, global_batch=24, micro_batch=8, rank=ctx.rank, world_size=ctx.world_size)
        torch.manual_seed(0)
        model = lib.DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ckpt = lib.Checkpointer(args.dir, rank=ctx.rank, world_size=ctx.world_size, resizable=True)
        survivor = lib.Survivor(ctx.rank, ctx.agent_store)

        epoch = cursor = step = 0
        if (resumed := ckpt.load()) is not None:
            saved = resumed[1]
            model.module.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            epoch, cursor, step = saved["epoch"], saved["cursor"], saved["step"]
        lib.log0(ctx, "start", step=step, epoch=epoch, world_size=ctx.world_size, cursor=cursor)

        def state() -> dict[str, Any]:
            return {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
                "cursor": cursor,
                "step": step,
            }

        try:
            while epoch < args.epochs:
                for batch in loader.steps(epoch, cursor):
                    loss = lib.accumulate_gradients(model, iter(batch.micro), len(batch.micro), weights=batch.weights)
                    optimizer.step()
                    optimizer.zero_grad()
                    step, cursor = step + 1, batch.cursor
                    survivor.arm()
                    if step == args.kill_at and ctx.rank == ctx.world_size - 1:
                        os.kill(os.getpid(), signal.SIGKILL)
                lib.log0(ctx, "step", step=step, epoch=epoch, loss=float(loss))
                epoch, cursor = epoch + 1, 0
                ckpt.save(step, state(), reason="epoch", epoch=epoch)
        except Exception as error:  # a peer died: the lowest survivor saves the last step
            survivor.save(error, ckpt, step, state())
            raise
        lib.log0(ctx, "done", step=step, epoch=epoch)


if __name__ == "__main__":
    main()
