"""Data order: sharded per rank, reshuffled per epoch, resumable (:mod:`ddp_trainer.train.data`)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from ddp_trainer.core import config
from ddp_trainer.train import data
from ddp_trainer.train.data import micro_batches, synthetic


def test_resuming_the_data_skips_exactly_what_was_consumed() -> None:
    data = synthetic(config.TrainerConfig(seed=1))
    kwargs = {"batch_size": 64, "rank": 1, "world_size": 4, "seed": 1}
    straight = micro_batches(data, **kwargs)
    seen = [next(straight) for _ in range(40)]  # crosses into epoch 1 (2048 / 64 = 32 per epoch)
    resumed = micro_batches(data, skip=30, **kwargs)
    for (e1, x1, y1), (e2, x2, y2) in zip(seen[30:], resumed, strict=False):
        assert e1 == e2 and torch.equal(x1, x2) and torch.equal(y1, y2)
    assert seen[35][0] == 1 and not torch.equal(seen[0][1], seen[32][1])  # set_epoch reshuffles
    other = next(micro_batches(data, **(kwargs | {"rank": 2})))
    assert not torch.equal(other[1], seen[0][1])  # each rank its own shard


@pytest.mark.parametrize(
    "worlds", [[6] * 12, [6, 6, 4, 4, 4, 6, 6, 6, 2, 6, 6, 6], [5, 3, 7, 1, 4, 6, 2, 6, 6, 6]]
)
def test_an_elastic_epoch_trains_on_every_sample_exactly_once_whatever_the_resizes(worlds: list[int]) -> None:
    """The world's order, not the rank's: any sequence of world sizes (one per step) covers the epoch's
    samples once each, none repeated, none skipped (the tail that fills no global batch dropped)."""
    samples, size = 1000, 96  # 10 steps per epoch; 96 divides by 6, 4, 3, 2 and 1, not by 5 or 7
    by_epoch: dict[int, list[int]] = {}
    for step, world in enumerate(worlds):
        for rank in range(world):
            epoch, share = data.step_share(
                samples, step=step, global_size=size, rank=rank, world_size=world, seed=5
            )
            by_epoch.setdefault(epoch, []).extend(share.tolist())
    first = by_epoch[0]
    assert len(first) == len(set(first)) == 10 * size
    assert set(first) <= set(range(samples))
    if 1 in by_epoch:  # the next epoch starts over in another order
        assert len(by_epoch[1]) == len(set(by_epoch[1]))


def test_a_resumed_elastic_run_continues_at_the_step_it_left_at_any_world_size() -> None:
    before = [data.step_share(500, step=3, global_size=48, rank=r, world_size=4, seed=1)[1] for r in range(4)]
    after = [data.step_share(500, step=3, global_size=48, rank=r, world_size=3, seed=1)[1] for r in range(3)]
    assert torch.equal(torch.cat(before), torch.cat(after))


def test_elastic_micro_batches_weigh_the_global_mean_even_when_it_does_not_divide() -> None:
    dataset = TensorDataset(torch.arange(400.0)[:, None], torch.zeros(400, dtype=torch.long))
    size, world = 50, 3  # 17, 17 and 16 samples
    totals = []
    for rank in range(world):
        per_step, batches = data.elastic_batches(
            dataset, batch_size=8, global_size=size, rank=rank, world_size=world, seed=0
        )
        assert per_step == 3  # ceil(17 / 8)
        step = [next(batches) for _ in range(per_step)]
        assert all(0 < len(inputs) <= 8 for _, inputs, _, _ in step)
        totals.append(sum(len(inputs) for _, inputs, _, _ in step))
        # each micro-batch's mean loss times its weight, averaged over the ranks by DDP, is the global mean
        assert sum(weight for *_, weight in step) == pytest.approx(totals[-1] * world / size)
    assert sorted(totals) == [16, 17, 17]


def test_an_elastic_global_batch_larger_than_the_data_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="global batch of 600 samples is larger than the dataset"):
        data.step_share(500, step=0, global_size=600, rank=0, world_size=2, seed=0)
