"""FSDP2 and HSDP: which ranks hold the same bytes, so that the replica check compares those and no others.

A model sharded with ``fully_shard`` holds DTensor parameters. Over a 1-D mesh (FSDP) every rank holds its
own shard of each parameter: no two ranks hold the same bytes, and there is nothing to compare. Over a 2-D
mesh with placements ``(Replicate(), Shard(0))`` (HSDP) the ranks of one *replica group* (the replicate
dimension's process group) each hold the same shard, and those copies must stay bit-identical exactly as
DDP replicas must. :func:`layout` reads that from the parameters (the DeviceMesh the script built: no code
change), the check then compares each rank's local shard, its optimizer state and the module's buffers
within its replica group only (the same 8 bytes per tensor, on that group), and :func:`combine` makes the
verdict the whole world's, so every rank acts on a divergence at the same check.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer.sync import replicas

FSDP_ONLY = (
    "FSDP shards every parameter across all ranks (fully_shard over a 1-D mesh): no two ranks hold the "
    "same parameters, so there is nothing to compare; HSDP (a 2-D mesh, replicate x shard) is checked"
)


@dataclass(frozen=True)
class Layout:
    """How a ``fully_shard`` model's parameters lie over its mesh, seen from this rank."""

    mesh_shape: tuple[int, ...]
    replicate_dim: int | None
    """The mesh dimension whose placement is ``Replicate`` for every parameter; None for FSDP alone."""
    group: dist.ProcessGroup | None
    """This rank's replica group: the ranks that hold the same shard (None for FSDP alone)."""
    replicas: tuple[int, ...]
    """The global ranks of that group, in order (this rank alone for FSDP)."""
    shard: int
    """Which shard this rank holds: its coordinate over the mesh's other dimensions, flattened."""

    @property
    def shards(self) -> int:
        return math.prod(self.mesh_shape) // max(len(self.replicas), 1)

    @property
    def kind(self) -> str:
        return "HSDP" if self.replicate_dim is not None else "FSDP"

    def describe(self) -> str:
        """One phrase for the summary: ``HSDP 2 x 2: each shard compared across its 2 replicas``."""
        if self.replicate_dim is None:
            return f"FSDP over {self.shards} ranks: nothing replicated"
        shape = " x ".join(str(n) for n in self.mesh_shape)
        return f"HSDP {shape}: each of {self.shards} shards compared across its {len(self.replicas)} replicas"


def is_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor (FSDP2's parameters and their optimizer state), told by its API, without importing it."""
    return hasattr(tensor, "device_mesh") and hasattr(tensor, "to_local")


def layout(model: nn.Module) -> Layout | None:
    """The layout of ``model``'s DTensor parameters, or None when it has none (DDP, or no wrapper). The
    replicate dimension is the mesh dimension every parameter replicates over; parameters that disagree
    on it (or a mesh of more than two dimensions with several), or one of size 1 (each replica group a
    single rank, which would be "verified" against itself), leave it None: nothing is compared."""
    sharded = [p for p in model.parameters() if is_sharded(p)]
    if not sharded:
        return None
    mesh = sharded[0].device_mesh  # type: ignore[attr-defined]
    shape = tuple(int(n) for n in mesh.mesh.shape)
    candidates = [
        dim
        for dim in range(len(shape))
        if all(p.placements[dim].is_replicate() for p in sharded)  # type: ignore[attr-defined]
    ]
    coordinate = list(mesh.get_coordinate() or [0] * len(shape))
    rank = dist.get_rank()
    if len(candidates) != 1 or len(shape) < 2 or shape[candidates[0]] < 2:
        return Layout(shape, None, None, (rank,), _flat(coordinate, shape, skip=None))
    dim = candidates[0]
    group = mesh.get_group(dim)
    members = tuple(dist.get_process_group_ranks(group))
    return Layout(shape, dim, group, members, _flat(coordinate, shape, skip=dim))


def _flat(coordinate: list[int], shape: tuple[int, ...], skip: int | None) -> int:
    index = 0
    for dim, (c, n) in enumerate(zip(coordinate, shape, strict=True)):
        if dim != skip:
            index = index * n + c
    return index


def combine(
    report: replicas.SyncReport, mine: Layout, world: dist.ProcessGroup | None
) -> replicas.SyncReport:
    """The world's verdict from each replica group's: one flag all-reduced over ``world`` when every group
    agreed (the common case), else every group's mismatches gathered, each tensor named with its shard and
    each diverged rank with its replica group, identical on every rank."""
    flag = torch.tensor([0 if report.in_sync else 1], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=world)
    if not int(flag.item()):
        return report
    size = dist.get_world_size(world)
    gathered: list[tuple[int, replicas.SyncReport, Layout] | None] = [None] * size
    ours = (dist.get_rank(), report, dataclasses.replace(mine, group=None))  # a group does not pickle
    dist.all_gather_object(gathered, ours, group=world)
    mismatches: list[replicas.TensorMismatch] = []
    where: list[str] = []
    for sender, their, lay in (item for item in gathered if item is not None):
        if their.in_sync or sender != lay.replicas[0]:
            continue  # a group in sync, or a member of one whose first rank says it
        for m in their.mismatches:
            mismatches.append(dataclasses.replace(m, name=f"{m.name} (shard {lay.shard})"))
        for rank in their.ranks:
            reference = their.mismatches[0].reference_rank
            where.append(
                f"rank {rank} (replica {lay.replicas.index(rank)} of shard {lay.shard}, replica group "
                f"{list(lay.replicas)}) differs from rank {reference} (replica "
                f"{lay.replicas.index(reference)})"
            )
    return replicas.SyncReport(False, report.checked, tuple(mismatches), tuple(where))
