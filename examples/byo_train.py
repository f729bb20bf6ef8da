"""Bring your own training script, using kubetrain's trainer as a library.

    torchrun examples/byo_train.py --epochs 5                  # in a TrainingJob pod (PET_* set)
    torchrun --nproc-per-node 2 examples/byo_train.py --checkpoint-dir /tmp/byo   # on a laptop

Snapshots go to $KUBETRAIN_CHECKPOINT_DIR, which every TrainingJob pod gets: the checkpoint
volume (`checkpoint.dir`) on a cluster, `<run-dir>/checkpoints` with `kubetrain run --local`.
Never a path relative to the working directory: that would outlive the run dir and be resumed
by the next run. Without the variable, --checkpoint-dir. Rerun the same command after a crash:
it resumes from the newest complete checkpoint. Stopped by SIGTERM (the pod deleted, evicted,
preempted, suspended) or Ctrl-C, every rank stops at the same step and that step is saved:
the rerun loses none.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

from kubetrain.trainer import lib


def digits() -> tuple[TensorDataset, TensorDataset]:
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    test, train = perm[:360], perm[360:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("KUBETRAIN_CHECKPOINT_DIR", "./checkpoints"))
    args = parser.parse_args()
    ckpt_dir = Path(args.checkpoint_dir)

    with lib.distributed() as ctx:
        lib.configure_logging(ctx.rank)
        train_set, test_set = digits()
        loader = lib.sharded_loader(train_set, batch_size=args.batch_size, rank=ctx.rank, world_size=ctx.world_size)
        torch.manual_seed(0)
        model = lib.DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(ctx.device))
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        test_loader = lib.eval_loader(test_set, batch_size=512, rank=ctx.rank, world_size=ctx.world_size)
        # checkpoint.dir, or checkpoint.objectStore staged in it; it logs the checkpoint records itself.
        ckpt = lib.checkpointer(ckpt_dir, ctx, generators=[loader.generator])

        stop = lib.StopSignal(ctx)  # SIGTERM/SIGINT on any rank -> every rank stops at one step
        watchdog = lib.HangWatchdog(ctx.local_rank)  # steps stop -> stacks in the log (hangTimeoutSeconds)

        def save(reason: str) -> None:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            state.update(epoch=epoch, batch=batch, step=step)
            ckpt.save(step, state, reason=reason, epoch=epoch)  # "signal": returns once committed

        epoch = batch = step = 0  # batch: batches of `epoch` already trained
        resumed = ckpt.load()
        if resumed is not None:
            state = resumed[1]
            model.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            epoch, batch, step = state["epoch"], state["batch"], state["step"]
        resumed_from = str(resumed[0]) if resumed else None
        lib.log0(ctx, "start", step=step, epoch=epoch, total_steps=args.epochs * len(loader), directory=ckpt_dir,
                 world_size=ctx.world_size,
                 backend=ctx.backend, resumed_from=resumed_from)  # fmt: skip

        loss = torch.zeros(())
        while epoch < args.epochs:
            for x, y in loader.epoch(epoch, skip_batches=batch):
                loss = lib.accumulate_gradients(model, iter([(x, y)]), 1, loss_fn=F.cross_entropy)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step, batch = step + 1, batch + 1
                watchdog.beat()
                if stop.agreed():  # once per step, on every rank
                    save("signal")
                    stop.exit()
            accuracy, eval_loss = lib.evaluate(model.module, test_loader, ctx.device)
            lib.log0(ctx, "eval", step=step, epoch=epoch, directory=ckpt_dir, accuracy=accuracy, eval_loss=eval_loss)
            epoch, batch = epoch + 1, 0
            save("epoch")
        watchdog.stop()
        stop.close()
        ckpt.wait()  # the last upload committed before `done` (a no-op on a volume)
        final_accuracy, _ = lib.evaluate(model.module, test_loader, ctx.device)
        lib.log0(
            ctx, "done", step=step, epoch=args.epochs, directory=ckpt_dir, loss=float(loss), accuracy=final_accuracy
        )


if __name__ == "__main__":
    main()
