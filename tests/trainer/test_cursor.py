"""The global cursor (kubetrain.trainer.cursor): which samples each step trains, at any world size."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from kubetrain.trainer.cursor import CursorLoader, CursorSampler, GlobalBatches, split, weight

pytestmark = pytest.mark.unit


def _step_sets(batches: GlobalBatches, epoch: int, sizes: list[int], micro: int) -> list[list[list[int]]]:
    """Per step, each rank's micro-batches, with the world size changing to sizes[k] at step k."""
    steps = []
    for step, world in enumerate(sizes):
        cursor = step * batches.global_batch
        ranks = []
        for rank in range(world):
            sampler = CursorSampler(batches, rank=rank, world_size=world, micro_batch=micro)
            sampler.start(epoch, cursor)
            ranks.append(sampler.part(cursor).tolist())
        steps.append(ranks)
    return steps


@pytest.mark.parametrize(("length", "global_batch", "drop_last"), [(96, 12, True), (100, 12, True), (100, 12, False)])
def test_every_sample_once_per_epoch_whatever_the_sizes(length: int, global_batch: int, drop_last: bool) -> None:
    batches = GlobalBatches(length, global_batch, seed=5, drop_last=drop_last)
    steps = batches.steps_per_epoch
    resized = [3, 3, 2, 2, 1, 3, 5, 2, 3][:steps] + [3] * max(steps - 9, 0)
    for epoch in (0, 1):
        reference = _step_sets(batches, epoch, [3] * steps, micro=4)
        elastic = _step_sets(batches, epoch, resized, micro=4)
        # Each step trains the same global set at any size.
        for k in range(steps):
            assert sorted(i for part in elastic[k] for i in part) == sorted(i for part in reference[k] for i in part), k
        seen = Counter(i for step in elastic for part in step for i in part)
        assert max(seen.values()) == 1
        expected = length if not drop_last else (length // global_batch) * global_batch
        assert len(seen) == expected == batches.epoch_samples
    first, second = _step_sets(batches, 0, [1], micro=4)[0][0], _step_sets(batches, 1, [1], micro=4)[0][0]
    assert first != second, "each epoch has its own order"


def test_a_fixed_world_splits_as_distributed_sampler_does() -> None:
    data = TensorDataset(torch.arange(100))
    world, micro, accum = 3, 4, 2
    batches = GlobalBatches(100, micro * accum * world, seed=9)
    for rank in range(world):
        reference = DistributedSampler(data, num_replicas=world, rank=rank, seed=9, drop_last=True)  # type: ignore[arg-type]
        reference.set_epoch(1)
        shard = list(reference)
        sampler = CursorSampler(batches, rank=rank, world_size=world, micro_batch=micro)
        sampler.start(1, 0)
        ours = [i for batch in sampler for i in batch]
        assert ours == shard[: len(ours)]
        assert len(ours) == batches.steps_per_epoch * micro * accum


def test_a_loader_resumes_mid_epoch_on_the_next_step() -> None:
    batches = GlobalBatches(60, 6, seed=1)
    sampler = CursorSampler(batches, rank=1, world_size=2, micro_batch=2)
    sampler.start(0, 0)
    whole = list(sampler)
    sampler.start(0, 18)  # after three steps of three samples per rank, two micro-batches each
    assert list(sampler) == whole[6:]
    assert len(sampler) == len(whole) - 6
    with pytest.raises(ValueError, match="not the start of a step"):
        sampler.start(0, 7)


def test_uneven_parts_weigh_to_the_global_mean() -> None:
    """Seven samples over three ranks in micro-batches of two: each rank's weighted losses summed,
    then averaged over ranks (as DDP does), equal the mean over all seven."""
    torch.manual_seed(0)
    logits, labels = torch.randn(7, 4), torch.randint(0, 4, (7,))
    batches = GlobalBatches(7, 7, shuffle=False)
    world, total = 3, torch.zeros(())
    for rank in range(world):
        part = batches.rank_part(batches.order(0), 0, rank, world)
        for chunk in split(part, 2):
            total += F.cross_entropy(logits[chunk], labels[chunk]) * weight(len(chunk), world, 7)
    assert torch.allclose(total / world, F.cross_entropy(logits, labels))


def test_the_loader_hands_out_whole_steps_and_an_empty_batch_of_the_right_shape() -> None:
    data = TensorDataset(torch.arange(26, dtype=torch.float32).view(13, 2), torch.arange(13))
    loader = CursorLoader(data, global_batch=6, micro_batch=2, rank=2, world_size=3, shuffle=False, drop_last=False)
    steps = list(loader.steps(0))
    assert [s.cursor for s in steps] == [6, 12, 13]
    x, y = steps[0].micro[0]
    assert x.shape == (2, 2) and y.tolist() == [2, 5] and steps[0].weights == [1.0]
    (empty,) = steps[2].micro  # the tail of one sample went to rank 0
    assert empty[0].shape == (0, 2) and empty[1].shape == (0,) and steps[2].weights == [0.0]
    assert [s.cursor for s in loader.steps(0, 6)] == [12, 13]


def test_an_epoch_tail_shorter_than_the_world_leaves_a_rank_empty() -> None:
    batches = GlobalBatches(13, 6, drop_last=False)  # steps of 6, 6, 1 sample
    sampler = CursorSampler(batches, rank=2, world_size=3, micro_batch=4)
    assert sampler.plan(12) == ([0], 1)
    assert split(torch.arange(0), 4)[0].numel() == 0
    sampler.start(0, 12)
    assert list(sampler) == []
    loader = DataLoader(TensorDataset(torch.arange(13)), batch_sampler=sampler)
    assert list(loader) == []


def test_bad_sizes_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="larger than the dataset"):
        GlobalBatches(10, 11)
    assert GlobalBatches(10, 11, drop_last=False).steps_per_epoch == 1
    with pytest.raises(ValueError, match="rank 3 is not in a world of 3"):
        CursorSampler(GlobalBatches(10, 2), rank=3, world_size=3, micro_batch=1)
