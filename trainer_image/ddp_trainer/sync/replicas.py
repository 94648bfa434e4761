"""Replica agreement: the collectives behind :mod:`ddp_trainer.sync`, the public library (which
re-exports this module's public names beside :class:`~ddp_trainer.sync.health.SyncHealth`). The trainer's own
modules import this one, so the public module can sit above :mod:`ddp_trainer.sync.health` without a circle.

Prove that every rank holds the same model: bit-exact, cheap, on the device.

* :func:`fingerprint` — one int64 per tensor, a pure function of the tensor's raw bits.
* :func:`check_in_sync` — do all ranks hold the same tensors? Two tiny collectives in the common case.
* :func:`broadcast_module_` — make every rank hold ``src``'s tensors (after changing one rank on purpose,
  or to repair a divergence).
* :func:`average_module_` — make every rank hold the mean of all ranks' tensors (after independent
  per-rank changes, e.g. local fine-tuning steps).

Why not ``torch.distributed.broadcast_object_list([model.state_dict()])``? It pickles the objects and
*replaces the entries of the list* on the receiving ranks: the module's own parameters are never
written, so the model you train (and the optimizer, which holds references to those parameters) still
has the old values, while the code looks as if it synchronized them. The functions here write every
parameter and buffer in place, under ``torch.no_grad()``, so references held by DDP and the optimizer
see the new values.

Buffers and DDP. With ``DistributedDataParallel(broadcast_buffers=True)`` (the default) rank 0 owns the
buffers: DDP copies rank 0's buffers to every rank at the start of each forward, and the forward then
updates them from each rank's own batch (BatchNorm running statistics). Between steps they therefore
differ *by design*. To verify such a model, call :func:`broadcast_buffers_` first (the same copy DDP
makes at the next forward, made a step earlier) or pass ``buffers=False``; the trainer does the former,
so a check still proves that the buffers reached every rank bit for bit.

Long because it is the public library: each function documents the collective it makes and why.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_trainer.core.distributed import settle_gloo_at_exit
from ddp_trainer.sync.fingerprints import BLOCK, byte_view, fingerprint_tensor, fingerprint_tensors

__all__ = [
    "SyncReport",
    "TensorMismatch",
    "average_module_",
    "broadcast_buffers_",
    "broadcast_module_",
    "broadcast_tensors_",
    "check_in_sync",
    "comm_device",
    "fingerprint",
    "fingerprint_tensors",
    "named_tensors",
    "optimizer_state_tensors",
]

# The fingerprint (one int64 per tensor, a pure function of its raw bits, dtype and shape) lives in
# ddp_trainer.sync.fingerprints; it is re-exported here as part of this module's public API.
_BLOCK = BLOCK  # lanes per block (tests/integration/trainer/test_trainer_gpu.py sizes a tensor with it)
_STRUCTURE = "<structure>"


def named_tensors(module: nn.Module, *, buffers: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Parameters, then buffers, of ``module`` (looking through a DDP wrapper), in a fixed order."""
    inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
    named: list[tuple[str, torch.Tensor]] = list(inner.named_parameters())
    if buffers:
        named += list(inner.named_buffers())
    return named


def fingerprint(module: nn.Module, *, buffers: bool = True) -> torch.Tensor:
    """Fingerprint every parameter (and buffer) of ``module``: an int64 vector, one entry per tensor.

    Each entry is a pure function of the tensor's raw bits, shape-flattened in logical order: computed
    on the tensor's own device with integer arithmetic only, it is identical on every device and
    machine, and changes when any value changes by one ulp, or when values are swapped or transposed
    (each 64-bit word is mixed with its position before the sum). Works for every dtype; the algorithm
    is described in :mod:`ddp_trainer.sync.fingerprints`.
    """
    return fingerprint_tensors(local(t) for _, t in named_tensors(module, buffers=buffers))


@dataclass(frozen=True)
class TensorMismatch:
    """One tensor that is not identical on every rank."""

    name: str
    """Parameter/buffer name (without DDP's ``module.`` prefix), or the ``extra`` key."""
    ranks: tuple[int, ...]
    """Global ranks whose copy differs from the reference copy."""
    reference_rank: int
    """The rank holding the most common copy (lowest such rank on a tie)."""
    max_abs_diff: float
    """Largest ``|x - reference|`` over all ranks and elements (``inf`` when NaN is involved; ``nan``
    when shapes differ and no element-wise comparison is possible)."""


@dataclass(frozen=True)
class SyncReport:
    """The outcome of :func:`check_in_sync`; identical on every rank of the group."""

    in_sync: bool
    """Every tensor is bit-identical on every rank."""
    checked: int
    """How many tensors were compared (parameters, buffers and extras)."""
    mismatches: tuple[TensorMismatch, ...] = field(default=())
    """The tensors that differ, in module order."""
    where: tuple[str, ...] = field(default=())
    """For a sharded model (HSDP), each diverged rank with its replica group and shard
    (:func:`ddp_trainer.sync.sharded.combine`); empty otherwise."""

    @property
    def mismatched(self) -> tuple[str, ...]:
        """Names of the tensors that differ."""
        return tuple(m.name for m in self.mismatches)

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every rank that holds a copy different from the reference, sorted."""
        return tuple(sorted({r for m in self.mismatches for r in m.ranks}))

    @property
    def max_abs_diff(self) -> float:
        """Largest absolute difference over all mismatched tensors (0.0 when in sync)."""
        return max((m.max_abs_diff for m in self.mismatches), default=0.0, key=_nan_last)


def _nan_last(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _as_tensor(value: torch.Tensor | float | int | bool) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool):
        return torch.tensor(value, dtype=torch.bool)
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int64)
    return torch.tensor(float(value), dtype=torch.float64)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes this rank holds of ``tensor``: a DTensor's local shard (FSDP2, HSDP), else the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) and hasattr(tensor, "device_mesh") else tensor


def comm_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device collectives of ``group`` use: the current GPU for nccl, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def structure_fingerprint(named: Sequence[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """One int64 hash of the tensors' names, shapes and dtypes (not their values): equal on ranks that
    hold the same model's structure. :func:`check_in_sync` compares it beside the fingerprints, and
    :class:`~ddp_trainer.sync.health.SyncHealth`'s header agreement before them."""
    text = ";".join(f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in named).encode()
    return fingerprint_tensor(torch.tensor(list(text), dtype=torch.uint8))


def check_in_sync(
    module: nn.Module,
    group: dist.ProcessGroup | None = None,
    *,
    buffers: bool = True,
    extra: Mapping[str, torch.Tensor | float | int | bool] | None = None,
) -> SyncReport:
    """Check that every rank of ``group`` holds bit-identical parameters, buffers and ``extra`` values.

    Collective: every rank of the group must call it at the same point. Each rank fingerprints its
    tensors on their own devices; one ``all_reduce(MIN)`` and one ``all_reduce(MAX)`` of the fingerprint
    vector (8 bytes per tensor, never proportional to the model size) tell every rank which tensors
    differ. Only when some differ, an ``all_gather`` of their fingerprints names the ranks, and those
    tensors alone are broadcast from the reference rank to measure the largest absolute difference.

    ``extra`` adds named values to compare, e.g. :func:`optimizer_state_tensors` and control state
    (``{"step": 120, "lr": 3e-4}``). Pass ``buffers=False``, or call :func:`broadcast_buffers_` first,
    for a DDP model whose buffers are re-broadcast at each forward (see the module docstring).
    """
    settle_gloo_at_exit()  # a script that checks with no SyncHealth must not abort at exit either
    return compare_replicas(module, group, buffers=buffers, extra=extra)


def compare_replicas(
    module: nn.Module,
    group: dist.ProcessGroup | None = None,
    *,
    buffers: bool = True,
    extra: Mapping[str, torch.Tensor | float | int | bool] | None = None,
) -> SyncReport:
    """:func:`check_in_sync` for a caller that has its process wait for gloo at exit already
    (:func:`~ddp_trainer.core.distributed.settle_gloo_at_exit`: ``SyncHealth`` does when it is built, before
    its first check), so its checks do not ask again."""
    named = named_tensors(module, buffers=buffers)
    named += [(k, _as_tensor(v)) for k, v in (extra or {}).items()]
    device = comm_device(group)
    vec = torch.cat(
        (
            fingerprint_tensors((local(t) for _, t in named), device),
            structure_fingerprint(named).to(device)[None],
        )
    )
    low, high = vec.clone(), vec.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    bad = (low != high).nonzero().flatten().tolist()
    if not bad:
        return SyncReport(in_sync=True, checked=len(named))
    names = [n for n, _ in named] + [_STRUCTURE]
    return SyncReport(in_sync=False, checked=len(named), mismatches=_compare(named, names, vec, bad, group))


def _global(group: dist.ProcessGroup | None, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _compare(
    named: Sequence[tuple[str, torch.Tensor]],
    names: Sequence[str],
    vec: torch.Tensor,
    bad: list[int],
    group: dist.ProcessGroup | None,
) -> tuple[TensorMismatch, ...]:
    """Name the ranks that differ for each mismatched entry and measure the largest difference."""
    world = dist.get_world_size(group)
    mine = vec[bad].contiguous()
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    table = torch.stack(gathered).cpu().tolist()  # world x len(bad)
    structure_ok = bad[-1] != len(named)
    references: list[int] = []
    differing: list[tuple[int, ...]] = []
    for j in range(len(bad)):
        column = [table[r][j] for r in range(world)]
        counts = collections.Counter(column)
        best = max(counts.values())
        ref = next(r for r, v in enumerate(column) if counts[v] == best)
        references.append(ref)
        differing.append(tuple(_global(group, r) for r, v in enumerate(column) if v != column[ref]))
    diffs = torch.full((len(bad),), math.nan, dtype=torch.float64, device=vec.device)
    if structure_ok:  # shapes agree, so tensors can be compared element by element
        for j, idx in enumerate(bad):
            mine_ = local(named[idx][1]).detach()
            reference = mine_.to(vec.device, copy=True).contiguous()
            dist.broadcast(byte_view(reference), src=_global(group, references[j]), group=group)
            delta = (mine_.to(vec.device).double() - reference.double()).abs()
            diffs[j] = torch.nan_to_num(delta, nan=math.inf).max() if delta.numel() else 0.0
        dist.all_reduce(diffs, op=dist.ReduceOp.MAX, group=group)
    return tuple(
        TensorMismatch(names[idx], differing[j], _global(group, references[j]), float(diffs[j]))
        for j, idx in enumerate(bad)
    )


@torch.no_grad()
def broadcast_tensors_(
    tensors: Iterable[torch.Tensor], src: int = 0, group: dist.ProcessGroup | None = None
) -> None:
    """Overwrite each tensor, in place, with global rank ``src``'s copy (bit-exact: the bytes are sent)."""
    device = comm_device(group)
    for t in map(local, tensors):
        if t.is_contiguous() and t.device == device:
            dist.broadcast(byte_view(t), src=src, group=group)
        else:
            staged = t.detach().to(device, copy=True).contiguous()
            dist.broadcast(byte_view(staged), src=src, group=group)
            t.copy_(staged)


def broadcast_module_(
    module: nn.Module, src: int = 0, group: dist.ProcessGroup | None = None, *, buffers: bool = True
) -> None:
    """Make every rank hold global rank ``src``'s parameters and buffers, in place.

    Use it after changing the model on one rank on purpose (loading weights on rank 0 only, a surgery on
    one rank), or to repair a divergence: the result is bit-identical everywhere. The optimizer state
    is not touched: broadcast it with :func:`broadcast_tensors_` over :func:`optimizer_state_tensors`.
    Collective; never use ``broadcast_object_list`` for this (see the module docstring).
    """
    broadcast_tensors_((t for _, t in named_tensors(module, buffers=buffers)), src=src, group=group)


def broadcast_buffers_(module: nn.Module, src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Copy ``src``'s buffers to every rank: what DDP (``broadcast_buffers=True``) does at each forward."""
    inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
    broadcast_tensors_(inner.buffers(), src=src, group=group)


@torch.no_grad()
def average_module_(module: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Make every rank hold the mean over ranks of each floating-point parameter and buffer, in place.

    Use it after *independent* per-rank changes that should all count (local SGD steps, per-rank
    fine-tuning, model soups); use :func:`broadcast_module_` when one rank's version is the right one.
    The mean is an ``all_reduce(SUM)`` then a division (``ReduceOp.AVG`` exists only on NCCL), reduced in
    at least float32 and cast back. Integer and bool tensors (e.g. ``num_batches_tracked``) have no
    meaningful mean: they are broadcast from the group's rank 0. Every rank receives the same reduced
    bits, so the module is in sync afterwards; :func:`check_in_sync` proves it.
    """
    world = dist.get_world_size(group)
    device = comm_device(group)
    for _, t in named_tensors(module):
        if not t.is_floating_point():
            broadcast_tensors_([t], src=_global(group, 0), group=group)
            continue
        wide = t.detach().to(device=device, dtype=torch.promote_types(t.dtype, torch.float32), copy=True)
        dist.all_reduce(wide, op=dist.ReduceOp.SUM, group=group)
        t.copy_(wide / world)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer, module: nn.Module) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state, named ``optimizer.<param name>.<key>``, for verification.

    DDP never synchronizes optimizer state: after a restore that reached only some ranks, parameters
    can be identical (DDP's constructor broadcast) while, say, Adam's moments differ; pass this as
    ``extra`` to :func:`check_in_sync` to catch it. Non-tensor scalars become tensors.
    """
    names = {id(p): n for n, p in named_tensors(module, buffers=False)}
    out: dict[str, torch.Tensor] = {}
    for group_index, param_group in enumerate(optimizer.param_groups):
        for i, param in enumerate(param_group["params"]):
            pname = names.get(id(param), f"group{group_index}.{i}")
            state: dict[str, Any] = optimizer.state.get(param, {})
            for key in sorted(state):
                value = state[key]
                if isinstance(value, torch.Tensor | int | float):
                    out[f"optimizer.{pname}.{key}"] = _as_tensor(value)
    return out
