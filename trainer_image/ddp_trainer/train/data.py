"""Data: a seeded synthetic classification set (no download), user factories, and per-rank order.

Every rank generates the same dataset from the seed; :class:`~torch.utils.data.DistributedSampler`
(same seed on every rank, ``set_epoch`` each epoch) gives each rank its own disjoint shard and order.
Resuming at step *s* skips exactly the micro-batches already consumed, so a resumed run sees the same
batches as one that never stopped.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset, default_collate

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


def global_batch(config: TrainerConfig, procs_per_node: int) -> int:
    """An elastic job's samples per optimizer step, the same at every world size: ``batch_size x
    grad_accumulation x procs_per_node x elastic_max_nodes``."""
    return config.batch_size * config.grad_accumulation * procs_per_node * config.elastic_max_nodes


def step_share(
    samples: int, *, step: int, global_size: int, rank: int, world_size: int, seed: int
) -> tuple[int, torch.Tensor]:
    """``(epoch, sample indices)`` that ``rank`` of a world of ``world_size`` trains on at optimizer step
    ``step`` (0-based) of an elastic job. The order is the world's, not the rank's: each epoch is one
    seeded permutation of the dataset, step *s* takes its next ``global_size`` samples, and rank *r* the
    contiguous slice ``[r*G//W, (r+1)*G//W)`` of them. So whatever sequence of world sizes a run goes
    through, every sample of an epoch is trained on exactly once (the tail that fills no whole global batch
    is dropped, as ``drop_last`` does), and a resume at step *s* from a checkpoint continues exactly there."""
    per_epoch = samples // global_size
    if per_epoch < 1:
        raise ValueError(f"the global batch of {global_size} samples is larger than the dataset ({samples})")
    if global_size < world_size:
        raise ValueError(f"the global batch of {global_size} samples cannot feed {world_size} ranks")
    epoch, k = divmod(step, per_epoch)
    order = epoch_order(samples, seed, epoch)
    lo, hi = rank * global_size // world_size, (rank + 1) * global_size // world_size
    return epoch, order[k * global_size + lo : k * global_size + hi]


@functools.lru_cache(maxsize=2)
def epoch_order(samples: int, seed: int, epoch: int) -> torch.Tensor:
    """An elastic epoch's sample order, drawn once per epoch (not at every step: a permutation of a large
    dataset costs milliseconds). Read only: the shares are slices of it."""
    return torch.randperm(samples, generator=torch.Generator().manual_seed(seed + epoch))


def elastic_batches(
    dataset: Dataset[tuple[torch.Tensor, ...]],
    *,
    batch_size: int,
    global_size: int,
    rank: int,
    world_size: int,
    seed: int,
    start_step: int = 0,
) -> tuple[int, Iterator[tuple[int, torch.Tensor, torch.Tensor, float]]]:
    """An elastic job's micro-batches: ``(per_step, batches)``, where each optimizer step takes
    ``per_step`` micro-batches of ``(epoch, inputs, targets, loss weight)``. A rank's share of a step
    (:func:`step_share`) is split into ``per_step`` near-equal micro-batches of at most ``batch_size``;
    each micro-batch's mean loss is weighted by ``len x world_size / global_size``, so DDP's average over
    the ranks is the mean over the global batch even where it does not divide evenly."""
    samples = len(dataset)  # type: ignore[arg-type]
    per_step = math.ceil(math.ceil(global_size / world_size) / batch_size)

    def batches() -> Iterator[tuple[int, torch.Tensor, torch.Tensor, float]]:
        step = start_step
        while True:
            epoch, share = step_share(
                samples, step=step, global_size=global_size, rank=rank, world_size=world_size, seed=seed
            )
            for part in torch.tensor_split(share, per_step):
                inputs, targets = default_collate([dataset[int(i)] for i in part])
                yield epoch, inputs, targets, len(part) * world_size / global_size
            step += 1

    return per_step, batches()
