"""The fingerprint of one CPU tensor with NumPy: zero-copy on the tensor's memory, passes of 32K lanes
through two reused uint64 buffers (nine vector operations per pass). The block sums can come from a
faster kernel (``numba_kernel.block_sums``); the fold around them is the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from ddp_trainer.sync.fingerprints.definition import (
    BLOCK,
    ROUNDS,
    G,
    H,
    byte_view,
    lane_count,
    meta_hash,
    mix64,
    signed,
)

BlockSums = Callable[[np.ndarray, np.ndarray, int], np.ndarray]
"""``(lanes, keys, blocks) -> s[b]``: the block sums of ``blocks`` blocks (``keys[j] = (j + 1) * G``)."""

_SUB = 1 << 15  # lanes per pass: three uint64 buffers stay in a 1 MiB L2 cache
_local = threading.local()  # scratch buffers per thread, so concurrent callers do not share them


def _np_buffers() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    have: tuple[np.ndarray, np.ndarray, np.ndarray] | None = getattr(_local, "numpy", None)
    if have is None:
        keys = np.arange(1, BLOCK + 1, dtype=np.uint64) * np.uint64(G)
        have = (keys, np.empty(_SUB, dtype=np.uint64), np.empty(_SUB, dtype=np.uint64))
        _local.numpy = have
    return have


def _np_mix(y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``F`` in place on a uint64 array (numpy's uint64 shifts are logical; products wrap)."""
    for shift, mult in ROUNDS:
        np.right_shift(y, np.uint64(shift), out=z)
        y ^= z
        if mult:
            y *= np.uint64(mult)
    return y


def _np_lanes(t: torch.Tensor) -> np.ndarray:
    """The lanes of a CPU tensor as uint64 (zero-copy unless unaligned or with a partial lane)."""
    raw = byte_view(t).numpy()
    if raw.size % 8 or raw.ctypes.data % 8:
        padded = np.zeros(lane_count(raw.size) * 8, dtype=np.uint8)
        padded[: raw.size] = raw
        raw = padded
    return raw.view(np.uint64)


def block_sums(lanes: np.ndarray, keys: np.ndarray, blocks: int) -> np.ndarray:
    """``s[b]`` for every block of the uint64 ``lanes``, in passes of ``_SUB`` lanes."""
    _, y, z = _np_buffers()
    starts = range(0, lanes.size, _SUB)  # _SUB divides BLOCK: a pass never straddles two blocks
    sub = np.zeros(len(starts), dtype=np.uint64)
    for k, start in enumerate(starts):
        n = min(_SUB, lanes.size - start)
        offset = start % BLOCK
        np.add(lanes[start : start + n], keys[offset : offset + n], out=y[:n])
        sub[k] = _np_mix(y[:n], z[:n]).sum(dtype=np.uint64)  # uint64 sums wrap modulo 2**64
    return np.add.reduceat(sub, np.arange(0, sub.size, BLOCK // _SUB)) if sub.size else sub


def fingerprint(t: torch.Tensor, sums: BlockSums = block_sums) -> int:
    """The fingerprint of one CPU tensor as a signed int (``sums``: where the block sums come from)."""
    lanes = _np_lanes(t)
    keys, _, _ = _np_buffers()
    blocks = sums(lanes, keys, -(-lanes.size // BLOCK))
    blocks += (np.arange(blocks.size, dtype=np.uint64) + np.uint64(1)) * np.uint64(H)
    data = int(_np_mix(blocks, np.empty_like(blocks)).sum(dtype=np.uint64))
    return signed(mix64(data + meta_hash(t.dtype, t.shape)))
