"""The fingerprint's definition: one int64 per tensor, a pure function of its raw bits, dtype and shape.

The hash (every operation is on 64-bit words, arithmetic modulo 2**64):

1. Bytes. The tensor's bytes in logical element order (``t.detach().reshape(-1)``, so a transposed copy
   is different data, while a non-contiguous view hashes like its contiguous copy), padded with zero
   bytes to a multiple of 8, are read as little-endian 64-bit lanes ``v[0], v[1], ...``. Every dtype
   works the same way (float64/32/16, bfloat16, float8, int64 ... uint8, bool, complex): an element
   never straddles two lanes, so one changed element is one changed lane.
2. Mixer. ``F`` is the finalizer of splitmix64 (Stafford's "mix13")::

       z ^= z >> 30;  z *= 0xBF58476D1CE4E5B9;  z ^= z >> 27;  z *= 0x94D049BB133111EB;  z ^= z >> 31

   with logical shifts. Each step is invertible, so ``F`` is a bijection of 64-bit words.
3. Blocks. Lane ``i`` lies in block ``b = i // B`` at offset ``j = i % B`` (``B = 2**16`` lanes, 512 KiB).
   Block sum: ``s[b] = sum_j F(v[i] + (j + 1) * G)`` with ``G = 0x9E3779B97F4A7C15``.
   Data hash: ``D = sum_b F(s[b] + (b + 1) * H)`` with ``H = 0xD1B54A32D192ED03``.
   Both sums are modulo 2**64, so the result does not depend on the order of the additions: any
   device, any reduction tree, any chunking gives the same bits.
4. Metadata. ``m = 0``, then ``m = F(m + G + x)`` for each ``x`` of (dtype code, ndim, *shape); the
   fingerprint is ``F(D + m)`` as a signed int64. So ``[x]`` and ``[x, 0]`` (same padded lanes), fp32 and
   int32 of the same bits, or a ``(2, 3)`` and a ``(3, 2)`` tensor differ.

What it guarantees: a change of any single lane (one element: a one-ulp change, a sign flip, a NaN
payload) always changes the fingerprint, since ``F`` and adding a constant are bijections and exactly one
term of one sum changes. Swaps, transposes and any other change escape only if 64-bit sums of
pseudo-random words collide (about 2**-64). Position enters twice (the offset key ``(j+1)*G`` inside the
block, ``(b+1)*H`` per block), so swapped lanes feed different inputs to ``F``. The two-level form lets
the CPU path reuse one cached key table for every block; the result equals a flat per-lane definition in
strength. Tensors above 2**64 bytes are not a concern.

Every kernel of this package (``numpy_kernel``, ``numba_kernel``, ``torch_kernel``, ``triton_kernel``)
imports this module and nothing else of the package; ``dispatch`` chooses between them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

__all__ = [
    "BLOCK",
    "M1",
    "M2",
    "ROUNDS",
    "G",
    "H",
    "byte_view",
    "dtype_code",
    "lane_count",
    "meta_hash",
    "mix64",
    "signed",
]

if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("ddp_trainer.sync.fingerprints reads raw bits as little-endian words")

MASK = (1 << 64) - 1
BLOCK = 1 << 16
"""Lanes per block (part of the definition: changing it changes every fingerprint)."""
G = 0x9E3779B97F4A7C15
H = 0xD1B54A32D192ED03
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB
ROUNDS = ((30, M1), (27, M2), (31, 0))
"""``F``: for each (shift, multiplier): ``z ^= z >> shift``, then ``z *= multiplier`` unless 0."""

# Stable codes, folded into the metadata: the same bits in another dtype differ. Unknown dtypes get a
# code derived from their name.
_DTYPE_NAMES = [
    *("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"),
    *("complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"),
    *("float8_e8m0fnu", "uint16", "uint32", "uint64", "complex32"),
]
DTYPE_CODES = {getattr(torch, n): i + 1 for i, n in enumerate(_DTYPE_NAMES) if hasattr(torch, n)}


def signed(x: int) -> int:
    """A 64-bit word as the int64 with the same bits."""
    x &= MASK
    return x - (1 << 64) if x >> 63 else x


def mix64(z: int) -> int:
    """``F`` on a Python int (the reference definition; returns an unsigned 64-bit word)."""
    z &= MASK
    for shift, mult in ROUNDS:
        z ^= z >> shift
        if mult:
            z = z * mult & MASK
    return z


def dtype_code(dtype: torch.dtype) -> int:
    code = DTYPE_CODES.get(dtype)
    if code is None:  # a dtype newer than this table: a stable code from its name
        code = 1000
        for byte in str(dtype).encode():
            code = mix64(code + G + byte)
    return code


def meta_hash(dtype: torch.dtype, shape: Sequence[int]) -> int:
    """``m`` of step 4 (unsigned)."""
    m = 0
    for x in (dtype_code(dtype), len(shape), *shape):
        m = mix64(m + G + x)
    return m


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in logical order, 1-D uint8: a view of the same storage when ``t`` is contiguous
    (so writing into it, e.g. a broadcast, writes ``t``; every backend can send uint8), else a copy."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def lane_count(nbytes: int) -> int:
    return (nbytes + 7) // 8
