"""Datasets and sharded loaders. No distributed calls here: rank and world size come in as numbers.

Reproducibility rests on two things: the DistributedSampler's order is a pure function of
(seed, epoch), and each DataLoader owns its `generator=`, so creating an iterator never draws
from the global RNG (which dropout uses). A resumed run restores both and skips the batches
it already trained on without loading them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, TensorDataset

from kubetrain.api.training import TrainingSpec
from kubetrain.runtime.worker.stopping import loader_worker_init

NUM_CLASSES = 10


@dataclass(frozen=True)
class Splits:
    train: TensorDataset
    test: TensorDataset
    input_shape: tuple[int, ...]
    num_classes: int


def _digits(seed: int, test_fraction: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images, digits.target, test_size=test_fraction, random_state=seed, stratify=digits.target
    )
    # Pixels are 0..16; scale to unit range and add the channel axis a CNN expects.
    return (
        torch.tensor(x_train / 16.0, dtype=torch.float32).unsqueeze(1),
        torch.tensor(y_train, dtype=torch.long),
        torch.tensor(x_test / 16.0, dtype=torch.float32).unsqueeze(1),
        torch.tensor(y_test, dtype=torch.long),
    )


def synthetic(
    samples: int, features: int, seed: int, test_fraction: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gaussian inputs labelled by a random linear teacher: learnable, any size, no files."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    teacher = torch.randn(features, NUM_CLASSES, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    n_test = max(1, int(samples * test_fraction))
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


def load_splits(spec: TrainingSpec) -> Splits:
    if spec.dataset == "digits":
        x_train, y_train, x_test, y_test = _digits(spec.seed, spec.test_fraction)
    else:
        x_train, y_train, x_test, y_test = synthetic(
            spec.synthetic_samples, spec.synthetic_features, spec.seed, spec.test_fraction
        )
    return Splits(TensorDataset(x_train, y_train), TensorDataset(x_test, y_test), tuple(x_train.shape[1:]), NUM_CLASSES)


class ResumableDistributedSampler(DistributedSampler[Any]):
    """DistributedSampler that can start an epoch at a sample offset (a mid-epoch resume).

    `drop_last=True` here trims the dataset to a multiple of the world size instead of padding
    with repeats, so every sample an epoch visits is visited by exactly one rank, once.
    """

    def __init__(self, dataset: Sized, *, num_replicas: int, rank: int, seed: int, shuffle: bool = True) -> None:
        super().__init__(
            dataset,  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=True,
        )
        self.start = 0

    def set_start(self, start: int) -> None:
        """Skip the first `start` samples of this rank's shard in the next iteration only."""
        self.start = start

    def __iter__(self) -> Iterator[Any]:
        indices = list(super().__iter__())
        start, self.start = self.start, 0
        return iter(indices[start:])

    def __len__(self) -> int:
        return self.num_samples


class _Shard(Sampler[int]):
    """rank::world_size without padding: evaluation counts every test sample exactly once."""

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, length, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


@dataclass
class ShardedLoader:
    """A training DataLoader with the handles a resumable loop needs."""

    loader: DataLoader[Any]
    sampler: ResumableDistributedSampler
    generator: torch.Generator
    batch_size: int

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, epoch: int, *, skip_batches: int = 0) -> Iterator[Any]:
        """An iterator over this rank's shard for `epoch`, starting after `skip_batches` batches."""
        self.sampler.set_epoch(epoch)
        self.sampler.set_start(skip_batches * self.batch_size)
        return iter(self.loader)


def sharded_loader(
    dataset: Dataset[Any],
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
    num_workers: int = 0,
    pin_memory: bool = False,
) -> ShardedLoader:
    """This rank's training loader: seeded DistributedSampler shard, own generator, per-process batches."""
    sampler = ResumableDistributedSampler(
        dataset,  # type: ignore[arg-type]
        num_replicas=world_size,
        rank=rank,
        seed=seed,
        shuffle=shuffle,
    )
    generator = torch.Generator().manual_seed(seed + rank)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=num_workers,
        pin_memory=pin_memory,
        generator=generator,
        persistent_workers=False,
        worker_init_fn=loader_worker_init,  # a stop signal leaves the batches coming until the rank saves
    )
    return ShardedLoader(loader, sampler, generator, batch_size)


def eval_loader(
    dataset: Dataset[Any], *, batch_size: int, rank: int, world_size: int, pin_memory: bool = False
) -> DataLoader[Any]:
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=_Shard(len(dataset), rank, world_size),  # type: ignore[arg-type]
        pin_memory=pin_memory,
    )
