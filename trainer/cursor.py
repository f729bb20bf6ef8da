"""One global cursor into each epoch's seeded order: which samples each step trains, at any world size.

An epoch's order is a permutation of the dataset, a pure function of (seed, epoch): the same
`torch.randperm` DistributedSampler draws. Step k of an epoch trains the global batch at
positions [k*G, k*G + G) of that order, whatever the number of processes; rank r of W takes every
W-th of them (positions r, r+W, ...), in micro-batches of at most `micro_batch` samples. So the
position in an epoch is one number, `cursor` (samples of the order already trained), and a run
saved at W processes continues at M: every sample of an epoch is trained exactly once, and every
step trains the same samples, whatever the sizes were.

At a fixed W with G = micro_batch x accumulation x W this is exactly DistributedSampler's split
(rank r's shard is order[r::W], cut into consecutive batches). When W does not divide G, or
at an epoch's last, shorter batch, ranks get up to one sample more or fewer than others; the
loss of each micro-batch is weighted by its share of the global batch (`weight`), so that DDP's
mean over ranks is the mean over the global batch, whatever the split. A rank may get no sample
at all (an epoch's tail shorter than W): it still takes part in the step with an empty batch.

Nothing here is distributed: rank and world size come in as numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler, default_collate


@dataclass(frozen=True)
class GlobalBatches:
    """`length` samples, an epoch's seeded order of them, cut into global batches of `global_batch`.

    `drop_last` drops each epoch's last global batch when it is shorter than the others (its
    samples are not trained that epoch, at any world size); otherwise it is a shorter step."""

    length: int
    global_batch: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"the dataset is empty (length {self.length})")
        if self.global_batch < 1:
            raise ValueError(f"the global batch must be at least 1 sample, not {self.global_batch}")
        if self.drop_last and self.global_batch > self.length:
            raise ValueError(
                f"the global batch ({self.global_batch} samples) is larger than the dataset ({self.length}): "
                "an epoch would have no step (lower the batch size, or keep the last short batch: dropLast false)"
            )

    @property
    def steps_per_epoch(self) -> int:
        full, rest = divmod(self.length, self.global_batch)
        return full if self.drop_last or rest == 0 else full + 1

    @property
    def epoch_samples(self) -> int:
        """The samples one epoch trains: the whole dataset, less a dropped last batch."""
        return min(self.steps_per_epoch * self.global_batch, self.length)

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's permutation of sample indices (int64), as DistributedSampler draws it."""
        if not self.shuffle:
            return torch.arange(self.length)
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.length, generator=generator)

    def window(self, cursor: int) -> tuple[int, int]:
        """[start, end) of the order that the step at `cursor` trains."""
        if cursor % self.global_batch or not 0 <= cursor < self.epoch_samples:
            raise ValueError(
                f"cursor {cursor} is not the start of a step of this epoch "
                f"(global batch {self.global_batch}, {self.epoch_samples} samples per epoch)"
            )
        return cursor, min(cursor + self.global_batch, self.length)

    def rank_part(self, order: torch.Tensor, cursor: int, rank: int, world_size: int) -> torch.Tensor:
        """The indices rank `rank` of `world_size` trains in the step at `cursor`."""
        start, end = self.window(cursor)
        return order[start + rank : end : world_size]

    def micro_batches(self, micro_batch: int, world_size: int) -> int:
        """How many micro-batches of at most `micro_batch` samples the largest rank part of a full
        step needs: a step's gradient accumulation at `world_size` processes."""
        return math.ceil(math.ceil(self.global_batch / world_size) / micro_batch)


def split(part: torch.Tensor, micro_batch: int) -> list[torch.Tensor]:
    """A rank's part of a step as consecutive micro-batches of `micro_batch` samples (the last may
    be shorter); one empty micro-batch for an empty part (the rank still joins the step's sync)."""
    if len(part) == 0:
        return [part]
    return list(torch.split(part, micro_batch))


def weight(samples: int, world_size: int, step_samples: int) -> float:
    """The factor on a micro-batch's mean loss that makes DDP's mean of the ranks' gradients the
    mean over the step's `step_samples` samples: its share of them, times `world_size`."""
    return samples * world_size / step_samples


class CursorSampler(Sampler[list[int]]):
    """A DataLoader `batch_sampler` of one rank's micro-batches, step after step, from a position.

    `start(epoch, cursor)` before each `iter(loader)`; `plan(cursor)` says what the step at
    `cursor` holds for this rank without iterating: its micro-batches' sizes (an empty part yields
    no batch: the loop makes the empty one itself) and the step's sample count."""

    def __init__(self, batches: GlobalBatches, *, rank: int, world_size: int, micro_batch: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        self.batches = batches
        self.rank = rank
        self.world_size = world_size
        self.micro_batch = micro_batch
        self.epoch = 0
        self.cursor = 0
        self._order = batches.order(0)

    def start(self, epoch: int, cursor: int) -> None:
        if epoch != self.epoch:
            self._order = self.batches.order(epoch)
        self.epoch, self.cursor = epoch, cursor
        if cursor != self.batches.epoch_samples:
            self.batches.window(cursor)  # a cursor that is no step's start is refused here

    def part(self, cursor: int) -> torch.Tensor:
        return self.batches.rank_part(self._order, cursor, self.rank, self.world_size)

    def plan(self, cursor: int) -> tuple[list[int], int]:
        """(sizes of this rank's micro-batches, samples of the whole step) for the step at `cursor`."""
        start, end = self.batches.window(cursor)
        return [len(chunk) for chunk in split(self.part(cursor), self.micro_batch)], end - start

    def __iter__(self) -> Iterator[list[int]]:
        for cursor in range(self.cursor, self.batches.epoch_samples, self.batches.global_batch):
            part = self.part(cursor)
            if len(part):
                yield from (chunk.tolist() for chunk in split(part, self.micro_batch))

    def __len__(self) -> int:
        steps = range(self.cursor, self.batches.epoch_samples, self.batches.global_batch)
        return sum(math.ceil(len(self.part(cursor)) / self.micro_batch) for cursor in steps)


@dataclass
class Step:
    """One optimizer step of one rank: its micro-batches (one empty batch when it has no sample),
    the weight of each one's mean loss, and the epoch's cursor once the step is trained."""

    micro: list[Any]
    weights: list[float]
    cursor: int


class CursorLoader:
    """Whole steps of one rank, from any (epoch, cursor): a DataLoader over a CursorSampler.

        loader = CursorLoader(train_set, global_batch=96, micro_batch=32, rank=r, world_size=w)
        for step in loader.steps(epoch, cursor):
            loss = accumulate_gradients(model, iter(step.micro), len(step.micro), weights=step.weights)
            optimizer.step(); ...; cursor = step.cursor        # save (epoch, cursor) with the model

    Other keyword arguments go to the DataLoader (num_workers, pin_memory, worker_init_fn, ...)."""

    def __init__(
        self,
        dataset: Any,
        *,
        global_batch: int,
        micro_batch: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        **loader_kwargs: Any,
    ) -> None:
        self.dataset = dataset
        self.batches = GlobalBatches(len(dataset), global_batch, seed=seed, shuffle=shuffle, drop_last=drop_last)
        self.sampler = CursorSampler(self.batches, rank=rank, world_size=world_size, micro_batch=micro_batch)
        self.loader: DataLoader[Any] = DataLoader(dataset, batch_sampler=self.sampler, **loader_kwargs)

    @property
    def steps_per_epoch(self) -> int:
        return self.batches.steps_per_epoch

    def steps(self, epoch: int, cursor: int = 0) -> Iterator[Step]:
        """The epoch's remaining steps for this rank, from `cursor`."""
        self.sampler.start(epoch, cursor)
        data = iter(self.loader)
        world = self.sampler.world_size
        for at in range(cursor, self.batches.epoch_samples, self.batches.global_batch):
            sizes, samples = self.sampler.plan(at)
            next_cursor = at + samples
            if sizes == [0]:
                yield Step([self._empty()], [0.0], next_cursor)
            else:
                yield Step([next(data) for _ in sizes], [weight(n, world, samples) for n in sizes], next_cursor)

    def _empty(self) -> Any:
        """A batch of no sample, shaped as the dataset's (its first item, collated, cut to zero)."""
        return _cut(default_collate([self.dataset[0]]))


def _cut(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value[:0]
    if isinstance(value, (list, tuple)):
        return type(value)(_cut(item) for item in value)
    if isinstance(value, dict):
        return {key: _cut(item) for key, item in value.items()}
    return value
