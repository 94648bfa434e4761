"""Data order: sharded per rank, reshuffled per epoch, resumable (:mod:`ddp_trainer.train.data`)."""

from __future__ import annotations

import torch

from ddp_trainer.core import config
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
