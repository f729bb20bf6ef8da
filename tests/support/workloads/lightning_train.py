"""A Lightning script as its users write one, importing nothing of kubetrain: a tiny regression on
synthetic CPU data, DDP over every node (`num_nodes` from NNODES, as a launcher script reads it),
ModelCheckpoint into the job's checkpoint dir, and a resume from `last.ckpt` when there is one.

    torchrun lightning_train.py MAX_STEPS [STEP_SLEEP_S]

Each training step sleeps STEP_SLEEP_S (0.02 s by default): the steps of a bigger model, at a rate
the tests can watch."""

import os
import sys
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(pl.LightningModule):
    def __init__(self, step_sleep_s: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.step_sleep_s = step_sleep_s

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        time.sleep(self.step_sleep_s)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    max_steps = int(sys.argv[1])
    step_sleep_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.02
    torch.manual_seed(0)
    x = torch.randn(2048, 16)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    dirpath = os.environ.get("KUBETRAIN_CHECKPOINT_DIR", "checkpoints")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=int(os.environ.get("NNODES", "1")),
        strategy="ddp",
        max_steps=max_steps,
        callbacks=[ModelCheckpoint(dirpath=dirpath, save_last=True, every_n_train_steps=20)],
        enable_progress_bar=False,
        logger=False,
    )
    last = os.path.join(dirpath, "last.ckpt")
    trainer.fit(
        Regression(step_sleep_s),
        DataLoader(data, batch_size=32, shuffle=True),
        ckpt_path="last" if os.path.exists(last) else None,
    )


if __name__ == "__main__":
    main()
