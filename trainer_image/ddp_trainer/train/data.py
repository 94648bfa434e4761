"""Data: a seeded synthetic classification set (no download), user factories, and per-rank order.

Every rank generates the same dataset from the seed; :class:`~torch.utils.data.DistributedSampler`
(same seed on every rank, ``set_epoch`` each epoch) gives each rank its own disjoint shard and order.
Resuming at step *s* skips exactly the micro-batches already consumed, so a resumed run sees the same
batches as one that never stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from ddp_trainer.core.config import TrainerConfig
from ddp_trainer.train.factories import resolve

FEATURES = 32
CLASSES = 10
SAMPLES = 8192


def synthetic(config: TrainerConfig) -> Dataset[tuple[torch.Tensor, ...]]:
    """``SAMPLES`` points in ``FEATURES`` dimensions labelled by a fixed random teacher network."""
    gen = torch.Generator().manual_seed(config.seed + 1_000_003)
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)
    y = (torch.tanh(x) @ teacher + 0.1 * torch.randn(SAMPLES, CLASSES, generator=gen)).argmax(dim=1)
    return TensorDataset(x, y)


BUILTIN_DATASETS: dict[str, Callable[[TrainerConfig], Dataset[tuple[torch.Tensor, ...]]]] = {
    "synthetic": synthetic
}


def build_dataset(config: TrainerConfig) -> Dataset[tuple[torch.Tensor, ...]]:
    """Build ``config.dataset``: items are ``(input, target)`` pairs."""
    dataset: Dataset[tuple[torch.Tensor, ...]] = resolve(config.dataset, BUILTIN_DATASETS, "dataset")(config)
    return dataset


def micro_batches(
    dataset: Dataset[tuple[torch.Tensor, ...]],
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    skip: int = 0,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Endless ``(epoch, inputs, targets)`` micro-batches of this rank's shard, after skipping ``skip``."""
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    per_epoch = len(sampler) // batch_size
    if per_epoch < 1:
        raise ValueError(
            f"--batch-size={batch_size}: larger than this rank's shard of {len(sampler)} samples"
        )
    epoch, offset = divmod(skip, per_epoch)
    while True:
        sampler.set_epoch(epoch)
        indices = list(sampler)[offset * batch_size : per_epoch * batch_size]
        for inputs, targets in DataLoader(dataset, batch_size=batch_size, sampler=indices):
            yield epoch, inputs, targets
        epoch, offset = epoch + 1, 0
