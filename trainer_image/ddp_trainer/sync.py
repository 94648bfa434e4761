"""Prove that every rank holds the same model: bit-exact, cheap, on the device.

This module is a public library; use it from your own training code.

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
"""

from __future__ import annotations

import collections
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

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

# The fingerprint: two independent polynomial hashes modulo the Mersenne prime 2**31 - 1 of the tensor's
# raw bits split into 16-bit limbs, packed into one int64 (h_a * 2**31 + h_b). Every intermediate is a
# non-negative integer below 2**63, so int64 arithmetic never overflows and the result is the same on
# every device, machine and reduction order. Limb j of row k (rows of _ROW limbs) is weighted by
# r**j * rho**k (mod P); r and rho are primitive roots, so the weights within a row are distinct and
# non-zero: any change of one limb, and any swap of two different limbs in a row, changes each hash.
_P = 2**31 - 1
_ROW = 2**16  # limb < 2**16, weight < 2**31: a row sum stays below 2**63
_BLOCK = 16 * _ROW  # limbs per pass: bounds temporary memory (8 MiB per int64 temporary)
_HASHES = ((16807, 742938285), (48271, 950706376))
_STRUCTURE = "<structure>"
_weights_cache: dict[tuple[int, str], torch.Tensor] = {}
if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("ddp_trainer.sync reads raw bits as little-endian words")


def _powers(base: int, count: int, device: torch.device) -> torch.Tensor:
    """``base**i mod P`` for i in ``range(count)``, int64 on ``device`` (grown by doubling)."""
    out = torch.ones(1, dtype=torch.int64, device=device)
    while out.numel() < count:
        out = torch.cat((out, out * pow(base, out.numel(), _P) % _P))
    return out[:count]


def _weights(count: int, device: torch.device, which: int) -> torch.Tensor:
    """``(count, 2)``: limb weights (``which=0``: powers of r) or row weights (``which=1``: powers of rho)."""
    key = (which, str(device))
    have = _weights_cache.get(key)
    if have is None or have.shape[0] < count:
        size = max(count, 2 * have.shape[0] if have is not None else 0)
        have = torch.stack([_powers(bases[which], size, device) for bases in _HASHES], dim=1)
        _weights_cache[key] = have
    return have[:count]


def _int_view(t: torch.Tensor) -> torch.Tensor:
    """The same storage seen as an integer dtype of the same width (contiguous ``t`` only)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
    if width is None:
        raise TypeError(f"cannot fingerprint dtype {t.dtype}")
    return t if t.dtype == width else t.view(width)


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    """The same storage as 1-D bytes: every backend can broadcast uint8 (gloo has no int16, say)."""
    return t.reshape(-1).view(torch.uint8)


def _limbs(flat: torch.Tensor) -> torch.Tensor:
    """The raw bits of a 1-D tensor as int64 limbs in ``[0, 2**16)``, element by element, low limb first.

    Wider elements are read as consecutive 16-bit words of memory: low word first on the little-endian
    machines PyTorch runs on (checked at import).
    """
    bits = _int_view(flat)
    if bits.element_size() == 1:
        return bits.to(torch.int64)
    if flat.device.type == "cpu":  # uint16 conversion is a single pass on the CPU
        return bits.view(torch.uint16).to(torch.int64)
    return bits.view(torch.int16).to(torch.int64) & 0xFFFF


# Folded into each fingerprint, so that the same bits in another dtype differ.
_DTYPE_CODES = dict.fromkeys(
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    ]
)


def _row_sums(limbs: torch.Tensor) -> torch.Tensor:
    """``(rows, 2)`` exact integer sums of limb x limb weight per row, for both hashes (each < 2**63).

    The last row may be partial: it is summed with the first weights only, never padded.
    """
    weights = _weights(min(_ROW, limbs.numel()), limbs.device, 0)
    full = limbs.numel() // _ROW * _ROW
    parts = [limbs[:full].view(-1, _ROW)] if full else []
    if full < limbs.numel():
        parts.append(limbs[full:].view(1, -1))
    sums = []
    for rows in parts:
        w = weights[: rows.shape[1]]
        if rows.device.type == "cpu":  # integer matmul exists on the CPU only; both ways are exact
            sums.append(rows @ w)
        else:
            sums.append(torch.stack([(rows * w[:, i]).sum(dim=1) for i in range(len(_HASHES))], dim=1))
    return torch.cat(sums)


def _tensor_fingerprint(t: torch.Tensor) -> torch.Tensor:
    """0-d int64 fingerprint of one tensor, computed on its own device."""
    flat = t.detach().reshape(-1)  # logical order: a transposed copy is different data
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    per_element = max(1, flat.element_size() // 2)
    step = _BLOCK // per_element
    acc = torch.zeros(len(_HASHES), dtype=torch.int64, device=flat.device)
    for start in range(0, flat.numel(), step):
        row_sums = _row_sums(_limbs(flat[start : start + step]))
        first_row = start * per_element // _ROW
        row_weights = _weights(first_row + row_sums.shape[0], flat.device, 1)[first_row:]
        acc = (acc + (row_sums % _P * row_weights % _P).sum(dim=0)) % _P
    # Fold in the length and dtype, so that [x] and [x, 0], or fp32 and int32 of the same bits, differ.
    code = list(_DTYPE_CODES).index(t.dtype) + 1 if t.dtype in _DTYPE_CODES else 0
    acc = (acc * 65599 + (flat.numel() * 64 + code) % _P) % _P
    return acc[0] * 2**31 + acc[1]


def fingerprint_tensors(tensors: Iterable[torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """One int64 per tensor (see :func:`fingerprint`), on ``device`` (default: the first tensor's)."""
    parts = [_tensor_fingerprint(t) for t in tensors]
    if not parts:
        return torch.zeros(0, dtype=torch.int64, device=device)
    target = device if device is not None else parts[0].device
    return torch.stack([p.to(target) for p in parts])


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
    (the hash is positional, not a sum). Works for every float, integer and bool dtype.
    """
    return fingerprint_tensors(t for _, t in named_tensors(module, buffers=buffers))


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


def comm_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device collectives of ``group`` use: the current GPU for nccl, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _structure_fingerprint(named: Sequence[tuple[str, torch.Tensor]]) -> torch.Tensor:
    text = ";".join(f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in named).encode()
    return _tensor_fingerprint(torch.tensor(list(text), dtype=torch.uint8))


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
    named = named_tensors(module, buffers=buffers)
    named += [(k, _as_tensor(v)) for k, v in (extra or {}).items()]
    device = comm_device(group)
    vec = torch.cat(
        (fingerprint_tensors((t for _, t in named), device), _structure_fingerprint(named).to(device)[None])
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
            local = named[idx][1].detach()
            reference = local.to(vec.device, copy=True).contiguous()
            dist.broadcast(_byte_view(reference), src=_global(group, references[j]), group=group)
            delta = (local.to(vec.device).double() - reference.double()).abs()
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
    for t in tensors:
        if t.is_contiguous() and t.device == device:
            dist.broadcast(_byte_view(t), src=src, group=group)
        else:
            staged = t.detach().to(device, copy=True).contiguous()
            dist.broadcast(_byte_view(staged), src=src, group=group)
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
