"""Where each block of each tensor goes in the torch path
(:mod:`~ddp_trainer.sync.fingerprints.torch_kernel`): pure planning from the tensors' sizes, dtypes and
alignment, cached while they keep them.

Two kinds of chunk. A **direct** chunk is whole blocks of one large 8-byte-aligned tensor, read in place as a
``(rows, BLOCK)`` int64 view: on a GPU the fused kernel reads the model's memory itself, so these bytes
cross memory three times (read, the mixed terms written, read by the sum), not five. A **packed** chunk
gathers the rest (small tensors, a large tensor's partial last block, misaligned views) into rows of the
chunk buffer, one block per row. The block sums are written in that order, the direct chunks' rows first,
and one gather (``Geometry.order``) puts them in block order for the fold."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from ddp_trainer.sync.fingerprints.definition import BLOCK, meta_hash, signed

CHUNK_BYTES = {"cuda": 64 << 20, "cpu": 8 << 20}
"""Scratch per chunk: on a GPU few launches per byte, yet a check takes at most 128 MB from training (the
kept buffer and the fused kernel's output; GPU models under ``dispatch.TRITON_MIN_BYTES`` come here)."""
DIRECT_SHARE = 4
"""A tensor whose whole blocks fill at least 1/DIRECT_SHARE of a chunk is read in place (direct chunks):
below that, the launches its own chunks would need cost more than copying its bytes."""
_CACHE_SIZE = 8
_cache: collections.OrderedDict[tuple[Any, ...], Geometry] = collections.OrderedDict()
_lock = threading.Lock()


class Piece(NamedTuple):
    tensor: int
    """Index of the tensor in the call's list."""
    start: int
    """Its first byte in the tensor."""
    nbytes: int
    """Bytes copied (a direct chunk: read in place)."""
    row: int
    """Row of the chunk (a block) where its bytes start."""


class Chunk(NamedTuple):
    rows: int
    first: int
    """Its first row's place among the block sums as written: the direct chunks' rows, then the packed
    rows (``Geometry.order`` maps them to block order)."""
    lanes: tuple[Piece, ...]
    """Pieces copied as int64 lanes (8-byte aligned, whole lanes); a direct chunk's one piece."""
    raw: tuple[Piece, ...]
    """Pieces copied as bytes (a misaligned tensor, a partial last lane), into zeroed lanes."""
    tails: tuple[tuple[int, int], ...]
    """(row, valid lanes) of each partial block: its later terms are zeroed."""
    direct: bool
    """Whole blocks of one tensor, read in place (``lanes``: that one piece; no ``raw``, no ``tails``)."""


class Geometry(NamedTuple):
    chunks: tuple[Chunk, ...]
    blocks: int
    rows: int
    """Rows of the largest chunk."""
    first: list[int]
    """Each tensor's first block."""
    counts: list[int]
    """Blocks per tensor."""
    metas: list[int]
    order: list[int] | None
    """Where each block's sum is written (the direct chunks' rows, then the packed rows), for one gather
    into block order; None where that is block order (no direct chunk)."""
    on_device: dict[str, torch.Tensor]
    """The index tensors (the fold's, ``order``) on the geometry's device, made at the first call: later
    calls copy nothing to the device."""


def geometry_for(tensors: Sequence[torch.Tensor], device: torch.device) -> Geometry:
    """The plan for ``tensors`` (contiguous, on ``device``), from the cache when they have not changed."""
    rows = max(1, CHUNK_BYTES.get(device.type, CHUNK_BYTES["cuda"]) // (8 * BLOCK))
    key = (device, rows, *[(t.data_ptr() % 8, t.dtype, t.shape) for t in tensors])
    with _lock:
        have = _cache.get(key)
        if have is not None:
            _cache.move_to_end(key)
            return have
    made = plan(tensors, rows)
    with _lock:
        _cache[key] = made
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return made


def plan(tensors: Sequence[torch.Tensor], rows_per_chunk: int) -> Geometry:
    """Every block of every tensor placed in chunks of at most ``rows_per_chunk`` rows (see the module)."""
    chunks: list[Chunk] = []
    lanes: list[Piece] = []
    raw: list[Piece] = []
    tails: list[tuple[int, int]] = []
    first: list[int] = []
    count: list[int] = []
    packed: list[int] = []  # the block of each packed row
    direct: list[int] = []  # the block of each direct row
    direct_min = max(1, rows_per_chunk // DIRECT_SHARE)
    block = row = 0

    def close() -> None:
        nonlocal lanes, raw, tails, row
        if row:
            chunks.append(Chunk(row, len(packed) - row, tuple(lanes), tuple(raw), tuple(tails), False))
        row, lanes, raw, tails = 0, [], [], []

    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        blocks = -(-nbytes // (8 * BLOCK))
        first.append(block)
        count.append(blocks)
        aligned = t.data_ptr() % 8 == 0
        whole_blocks = nbytes // (8 * BLOCK) if aligned else 0
        if whole_blocks >= direct_min:  # in place, in chunks of even size
            n = -(-whole_blocks // rows_per_chunk)
            size = -(-whole_blocks // n)
            for b in range(0, whole_blocks, size):
                rows = min(size, whole_blocks - b)
                piece = Piece(i, 8 * BLOCK * b, 8 * BLOCK * rows, 0)
                chunks.append(Chunk(rows, len(direct), (piece,), (), (), True))
                direct += range(block + b, block + b + rows)
        else:
            whole_blocks = 0
        block += whole_blocks
        for b in range(whole_blocks, blocks):
            start = 8 * BLOCK * b
            size = min(8 * BLOCK, nbytes - start)
            whole = size // 8 * 8 if aligned else 0
            if (
                whole
                and lanes
                and lanes[-1].tensor == i
                and lanes[-1].row + lanes[-1].nbytes // (8 * BLOCK) == row
            ):
                last = lanes[-1]  # the tensor's previous whole block, one row up: one copy for both
                lanes[-1] = last._replace(nbytes=last.nbytes + whole)
            elif whole:
                lanes.append(Piece(i, start, whole, row))
            if size > whole:
                raw.append(Piece(i, start + whole, size - whole, row))
            if size < 8 * BLOCK:
                tails.append((row, -(-size // 8)))
            packed.append(block)
            row += 1
            block += 1
            if row == rows_per_chunk:
                close()
    close()
    metas = [signed(meta_hash(t.dtype, t.shape)) for t in tensors]
    rows = max((c.rows for c in chunks), default=0)
    order = None
    if direct:
        chunks = [c if c.direct else c._replace(first=len(direct) + c.first) for c in chunks]  # after them
        order = [0] * block
        for written, b in enumerate(direct + packed):
            order[b] = written
    return Geometry(tuple(chunks), block, rows, first, count, metas, order, {})
