"""Bring your data: a training script that reads its dataset from a mounted volume.

    python examples/byo_data_train.py --write-dataset /tmp/dataset     # a demo dataset (digits as CSV)
    kubetrain run examples/byo-data.yaml --local --volume dataset=/tmp/dataset
    kubectl apply -f examples/byo-data.yaml                            # the PVC `dataset` holds digits.csv

The job mounts the volume at /data and passes `--data /data/digits.csv`; a local run maps
/data to the --volume directory (recorded in the run directory's local-volumes.json).
Each CSV row is `label,feature,feature,...`.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from kubetrain.trainer import lib


def write_dataset(directory: Path) -> Path:
    from sklearn.datasets import load_digits

    digits = load_digits()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "digits.csv"
    with path.open("w", newline="") as out:
        csv.writer(out).writerows(
            [int(label), *(f"{v / 16:.4f}" for v in row)] for row, label in zip(digits.data, digits.target, strict=True)
        )
    return path


def read_dataset(path: Path) -> TensorDataset:
    with path.open(newline="") as rows:
        table = [[float(value) for value in row] for row in csv.reader(rows) if row]
    data = torch.tensor(table)
    return TensorDataset(data[:, 1:], data[:, 0].long())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("/data/digits.csv"), help="The CSV dataset.")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--write-dataset", type=Path, metavar="DIR", help="Write the demo dataset to DIR and exit.")
    args = parser.parse_args()
    if args.write_dataset:
        print(write_dataset(args.write_dataset))
        return

    with lib.distributed() as ctx:
        lib.configure_logging(ctx.rank)
        dataset = read_dataset(args.data)
        metrics_dir = lib.checkpoint_dir("./checkpoints")  # rank 0's metrics.jsonl goes beside the checkpoints
        loader = lib.sharded_loader(dataset, batch_size=32, rank=ctx.rank, world_size=ctx.world_size)
        torch.manual_seed(0)
        features = dataset.tensors[0].shape[1]
        model = lib.DDP(nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 10)).to(ctx.device))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        lib.log0(ctx, "start", step=0, epoch=0, total_steps=args.epochs * len(loader), directory=metrics_dir,
                 samples=len(dataset), data=str(args.data))  # fmt: skip
        step, loss = 0, torch.zeros(())
        for epoch in range(args.epochs):
            for x, y in loader.epoch(epoch):
                loss = lib.accumulate_gradients(model, iter([(x, y)]), 1, loss_fn=F.cross_entropy)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
        lib.log0(ctx, "done", step=step, epoch=args.epochs, directory=metrics_dir, loss=float(loss))


if __name__ == "__main__":
    main()
