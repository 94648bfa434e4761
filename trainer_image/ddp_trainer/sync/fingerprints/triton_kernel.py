"""The fingerprint of :mod:`ddp_trainer.sync.fingerprints.definition` as two Triton launches, on CUDA.

Launch 1 has one program per block (``BLOCK`` lanes) of every tensor; it reads the block's lanes straight
from the tensor's memory (its address is in a table) and writes the block sum ``s[b]``. Launch 2 has one
program per tensor; it folds that tensor's block sums with the block index and the metadata hash. All
arithmetic is uint64 and wraps, so the result is bit-identical to the pure-torch path whatever the
order of additions. The tables (addresses, sizes, metadata) are built on the host and uploaded once,
then reused while the tensors keep their storage (same address, size, dtype and shape): nothing is
read back to the host. Lanes are loaded as 64-bit words when the block's address is 8-byte aligned, and
assembled from bytes otherwise and for a partial last lane (never reading past the tensor's end).

Under ``TRITON_INTERPRET=1`` (set before Triton is imported) the same kernels run on CPU tensors: the
tests use that to compare this path with the pure-torch one on a machine without a GPU.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from ddp_trainer.sync.fingerprints.definition import BLOCK, byte_view, lane_count, meta_hash, signed

try:  # Triton is optional: the pure-torch path serves when it is missing
    import triton  # type: ignore[import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped,unused-ignore]
except ImportError:  # pragma: no cover - depends on the install
    triton = None
    tl = None

__all__ = ["available", "fingerprint_tensors"]

TILE = 1024  # lanes per loop iteration of a program
WARPS = 8  # per program: with TILE, 4 lanes a thread in flight (measured best on an H200, bench/RESULTS.md)
_STEP = TILE * 0x9E3779B97F4A7C15 % (1 << 64)  # the key's advance per tile, (TILE * G) mod 2**64
_CACHE_SIZE = 8
_plans: collections.OrderedDict[tuple[Any, ...], _Plan] = collections.OrderedDict()


def available() -> bool:
    """Triton imports and a CUDA device is present (or the interpreter is on)."""
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _mix(z):  # type: ignore[no-untyped-def]
        z ^= z >> 30
        z *= 0xBF58476D1CE4E5B9
        z ^= z >> 27
        z *= 0x94D049BB133111EB
        z ^= z >> 31
        return z

    @triton.jit  # type: ignore[untyped-decorator,misc,unused-ignore]
    def _block_sums_kernel(table_ptr, out_ptr, TILE: tl.constexpr, STEP: tl.constexpr):  # type: ignore[no-untyped-def]
        c = tl.program_id(0)
        addr = tl.load(table_ptr + 3 * c)
        nbytes = tl.load(table_ptr + 3 * c + 1)
        aligned = tl.load(table_ptr + 3 * c + 2)
        nlanes = (nbytes + 7) // 8
        nfull = (nbytes // 8) * aligned  # lanes read as whole 64-bit words
        tiles = nfull // TILE
        lanes_ptr = addr.to(tl.pointer_type(tl.uint64))
        bytes_ptr = addr.to(tl.pointer_type(tl.uint8))
        j = tl.arange(0, TILE)
        key = (j.to(tl.uint64) + 1) * 0x9E3779B97F4A7C15  # (lane + 1) * G, advanced by TILE * G per tile
        acc = tl.zeros([TILE], dtype=tl.uint64)
        for t in range(0, tiles):  # whole tiles of whole lanes: no mask, no multiply for the key
            v = tl.load(lanes_ptr + t * TILE + j)
            acc += _mix(v + key)
            key += STEP
        for start in range(tiles * TILE, nfull, TILE):  # the last whole lanes (a partial tile)
            lane = start + j
            inside = lane < nfull
            v = tl.load(lanes_ptr + lane, mask=inside, other=0)
            acc += tl.where(inside, _mix(v + (lane.to(tl.uint64) + 1) * 0x9E3779B97F4A7C15), 0)
        for start in range(nfull, nlanes, TILE):  # misaligned block or partial last lane: from bytes
            lane = start + j
            v = tl.zeros([TILE], dtype=tl.uint64)
            for k in tl.static_range(8):
                offset = 8 * lane.to(tl.int64) + k
                byte = tl.load(bytes_ptr + offset, mask=offset < nbytes, other=0)
                v |= byte.to(tl.uint64) << (8 * k)
            term = _mix(v + (lane.to(tl.uint64) + 1) * 0x9E3779B97F4A7C15)
            acc += tl.where(lane < nlanes, term, 0)
        tl.store(out_ptr + c, tl.sum(acc, axis=0).to(tl.int64, bitcast=True))

    @triton.jit  # type: ignore[untyped-decorator,misc,unused-ignore]
    def _fold_kernel(sums_ptr, first_ptr, count_ptr, meta_ptr, out_ptr, TILE: tl.constexpr):  # type: ignore[no-untyped-def]
        t = tl.program_id(0)
        first = tl.load(first_ptr + t)
        count = tl.load(count_ptr + t)
        acc = tl.zeros([TILE], dtype=tl.uint64)
        for start in range(0, count, TILE):
            b = start + tl.arange(0, TILE)
            inside = b < count
            s = tl.load(sums_ptr + first + b, mask=inside, other=0).to(tl.uint64, bitcast=True)
            term = _mix(s + (b.to(tl.uint64) + 1) * 0xD1B54A32D192ED03)
            acc += tl.where(inside, term, 0)
        d = tl.sum(acc, axis=0) + tl.load(meta_ptr + t).to(tl.uint64, bitcast=True)
        tl.store(out_ptr + t, _mix(d).to(tl.int64, bitcast=True))

    @triton.jit  # type: ignore[untyped-decorator,misc,unused-ignore]
    def _read_blocks_kernel(table_ptr, out_ptr, TILE: tl.constexpr):  # type: ignore[no-untyped-def]
        # The floor of launch 1: the same grid over the same block table, the same loads (whole 64-bit
        # lanes in tiles, then bytes), and nothing but a wrapping sum of what was read (no mix, no key).
        c = tl.program_id(0)
        addr = tl.load(table_ptr + 3 * c)
        nbytes = tl.load(table_ptr + 3 * c + 1)
        aligned = tl.load(table_ptr + 3 * c + 2)
        nlanes = (nbytes + 7) // 8
        nfull = (nbytes // 8) * aligned
        tiles = nfull // TILE
        lanes_ptr = addr.to(tl.pointer_type(tl.uint64))
        bytes_ptr = addr.to(tl.pointer_type(tl.uint8))
        j = tl.arange(0, TILE)
        acc = tl.zeros([TILE], dtype=tl.uint64)
        for t in range(0, tiles):
            acc += tl.load(lanes_ptr + t * TILE + j)
        for start in range(tiles * TILE, nfull, TILE):
            lane = start + j
            acc += tl.load(lanes_ptr + lane, mask=lane < nfull, other=0)
        for start in range(nfull, nlanes, TILE):
            lane = start + j
            v = tl.zeros([TILE], dtype=tl.uint64)
            for k in tl.static_range(8):
                offset = 8 * lane.to(tl.int64) + k
                byte = tl.load(bytes_ptr + offset, mask=offset < nbytes, other=0)
                v |= byte.to(tl.uint64) << (8 * k)
            acc += tl.where(lane < nlanes, v, 0)
        tl.store(out_ptr + c, tl.sum(acc, axis=0).to(tl.int64, bitcast=True))


class _Plan(NamedTuple):
    """What the launches need for one list of tensors, built on the host once and kept on the device."""

    table: torch.Tensor
    """(address, bytes, 8-byte aligned) of every block of every tensor, int64."""
    first: torch.Tensor
    """Index of each tensor's first block."""
    counts: torch.Tensor
    """Blocks per tensor."""
    metas: torch.Tensor
    """Metadata hash per tensor (step 4 of the definition)."""
    blocks: int
    """Blocks in all (launch 1's grid)."""


def _key(tensors: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    return tuple([(t.data_ptr(), t.dtype, t.shape) for t in tensors])


def _build(tensors: Sequence[torch.Tensor], device: torch.device) -> _Plan:
    table: list[int] = []
    first: list[int] = []
    count: list[int] = []
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        addr = byte_view(t).data_ptr() if nbytes else 0
        first.append(len(table) // 3)
        blocks = (lane_count(nbytes) + BLOCK - 1) // BLOCK
        count.append(blocks)
        for b in range(blocks):
            start = addr + 8 * BLOCK * b
            table += [start, min(8 * BLOCK, nbytes - 8 * BLOCK * b), int(start % 8 == 0)]
    metas = [signed(meta_hash(t.dtype, t.shape)) for t in tensors]
    table_t, first_t, count_t, metas_t = (
        torch.tensor(values or [0], dtype=torch.int64, device=device)
        for values in (table, first, count, metas)
    )
    return _Plan(table_t, first_t, count_t, metas_t, len(table) // 3)


def _plan_for(tensors: Sequence[torch.Tensor], device: torch.device) -> _Plan:
    """The cached plan while every tensor keeps its address, dtype and shape (the usual case: a model's
    parameters between two checks), else a new one."""
    key = (device, *_key(tensors))
    have = _plans.get(key)
    if have is None:
        have = _build(tensors, device)
        _plans[key] = have
        while len(_plans) > _CACHE_SIZE:
            _plans.popitem(last=False)
    else:
        _plans.move_to_end(key)
    return have


def fingerprint_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One int64 fingerprint per tensor (all on one device), two launches, no host synchronisation."""
    if triton is None:
        raise RuntimeError("Triton is not installed")
    device = tensors[0].device
    # Logical order: a non-contiguous tensor is hashed through a contiguous copy (not cached: its
    # address changes every call). Parameters are contiguous, so the common case reads in place.
    flat = tensors if all(t.is_contiguous() for t in tensors) else [t.contiguous() for t in tensors]
    plan = _plan_for(flat, device)
    sums = torch.empty(max(plan.blocks, 1), dtype=torch.int64, device=device)
    out = torch.empty(len(flat), dtype=torch.int64, device=device)
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with on_device:  # launch on the tensors' GPU, whichever is current
        if plan.blocks:
            _block_sums_kernel[(plan.blocks,)](plan.table, sums, TILE=TILE, STEP=_STEP, num_warps=WARPS)
        _fold_kernel[(len(flat),)](sums, plan.first, plan.counts, plan.metas, out, TILE=256)
    return out


def read_blocks(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The fingerprint's read floor (``bench/fingerprint_bench.py``): launch 1's grid, block table and loads,
    with a plain wrapping sum of each block's 64-bit lanes in place of the hash; one int64 per block."""
    if triton is None:
        raise RuntimeError("Triton is not installed")
    device = tensors[0].device
    plan = _plan_for(tensors, device)
    sums = torch.empty(max(plan.blocks, 1), dtype=torch.int64, device=device)
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with on_device:
        if plan.blocks:
            _read_blocks_kernel[(plan.blocks,)](plan.table, sums, TILE=TILE, num_warps=WARPS)
    return sums
