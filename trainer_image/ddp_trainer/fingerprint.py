"""The per-tensor fingerprint: one int64, a pure function of a tensor's raw bits, dtype and shape.

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

Implementations, bit-identical (tests check each against an independent NumPy reference):

* NumPy (:func:`numpy_fingerprint`), CPU tensors (the default there): zero-copy on the tensor's memory,
  passes of 32K lanes through two reused uint64 buffers (nine vector operations per pass);
* pure torch (:func:`torch_fingerprint`), any device (the fallback on CUDA without Triton): the same
  in-place vector operations on int64, logical shifts emulated with a mask, no host synchronisation;
* Triton (``fingerprint_triton``), CUDA: one launch over a cached table of every block of every tensor,
  one launch for the per-tensor fold (the default on CUDA when Triton imports).

``DDPJOB_FINGERPRINT_IMPL=numba|numpy|torch|triton`` forces one (Numba and NumPy: CPU tensors only). On
the CPU the default is Numba where it imports (``fingerprint_numba``: the block sums in one compiled
pass, about 4x the NumPy path), else NumPy.

Long because the hash's exact definition lives here once, with the NumPy and torch paths that must
match it bit for bit (the Triton kernel is in ``fingerprint_triton``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable, Sequence

import numpy as np
import torch

__all__ = ["BLOCK", "fingerprint_tensor", "fingerprint_tensors", "meta_hash", "mix64"]

if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("ddp_trainer.fingerprint reads raw bits as little-endian words")

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
    """The tensor's bytes in logical order, 1-D uint8 (a view when ``t`` is contiguous)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def lane_count(nbytes: int) -> int:
    return (nbytes + 7) // 8


# --- NumPy, for CPU tensors (the same arithmetic with fewer, cheaper passes) -------------------------

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


def numpy_fingerprint(t: torch.Tensor, *, compiled: bool = False) -> int:
    """The fingerprint of one CPU tensor as a signed int, computed with NumPy (``compiled``: the block
    sums in one Numba pass, see ``fingerprint_numba``)."""
    lanes = _np_lanes(t)
    keys, y, z = _np_buffers()
    if compiled:
        from ddp_trainer import fingerprint_numba

        blocks = fingerprint_numba.block_sums(lanes, keys, -(-lanes.size // BLOCK))
    else:
        starts = range(0, lanes.size, _SUB)  # _SUB divides BLOCK: a pass never straddles two blocks
        sub = np.zeros(len(starts), dtype=np.uint64)
        for k, start in enumerate(starts):
            n = min(_SUB, lanes.size - start)
            offset = start % BLOCK
            np.add(lanes[start : start + n], keys[offset : offset + n], out=y[:n])
            sub[k] = _np_mix(y[:n], z[:n]).sum(dtype=np.uint64)  # uint64 sums wrap modulo 2**64
        blocks = np.add.reduceat(sub, np.arange(0, sub.size, BLOCK // _SUB)) if sub.size else sub
    blocks += (np.arange(blocks.size, dtype=np.uint64) + np.uint64(1)) * np.uint64(H)
    data = int(_np_mix(blocks, np.empty_like(blocks)).sum(dtype=np.uint64))
    return signed(mix64(data + meta_hash(t.dtype, t.shape)))


# --- pure torch -------------------------------------------------------------------------------------

_I64 = {name: signed(value) for name, value in (("G", G), ("H", H), ("M1", M1), ("M2", M2))}
_SIGNED_ROUNDS = tuple((shift, signed(mult)) for shift, mult in ROUNDS)


def mix_(y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``F`` in place on an int64 tensor ``y`` (``z``: scratch of the same shape)."""
    for shift, mult in _SIGNED_ROUNDS:
        torch.bitwise_right_shift(y, shift, out=z)  # arithmetic shift ...
        z.bitwise_and_((1 << (64 - shift)) - 1)  # ... made logical
        y.bitwise_xor_(z)
        if mult:
            y.mul_(mult)  # int64 multiplication wraps modulo 2**64 on every backend
    return y


def _buffers(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keys ``(j+1)*G`` for j < B, work buffer, scratch buffer), cached per device and thread.

    On CUDA the buffers are reused in stream order: use one stream per thread for fingerprints.
    """
    cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None
    cache = getattr(_local, "torch", None)
    if cache is None:
        cache = _local.torch = {}
    have = cache.get(device)
    if have is None:
        keys = torch.arange(1, BLOCK + 1, dtype=torch.int64, device=device).mul_(_I64["G"])
        have = (keys, torch.empty_like(keys), torch.empty_like(keys))
        cache[device] = have
    return have


def _lanes(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(full lanes as a 1-D int64 tensor, a zero-padded tail lane or None), zero-copy when possible."""
    raw = byte_view(t)
    full = raw.numel() // 8
    tail = None
    if raw.numel() % 8:
        tail = torch.zeros(8, dtype=torch.uint8, device=raw.device)
        tail[: raw.numel() - 8 * full] = raw[8 * full :]
        tail = tail.view(torch.int64)
    body = raw[: 8 * full]
    if body.data_ptr() % 8:  # a view at an odd offset: copy to an aligned buffer
        body = body.clone()
    return body.view(torch.int64), tail


def torch_block_sums(t: torch.Tensor) -> torch.Tensor:
    """``s[b]`` for every block of ``t`` (int64 vector on ``t``'s device), with torch ops only."""
    body, tail = _lanes(t)
    keys, y, z = _buffers(body.device)
    n = body.numel() + (tail is not None)
    sums = torch.empty(max(1, (n + BLOCK - 1) // BLOCK), dtype=torch.int64, device=body.device)
    if n == 0:
        return sums[:0]
    for k, start in enumerate(range(0, n, BLOCK)):
        count = min(BLOCK, n - start)
        src = body[start : start + count]
        if src.numel() < count:  # the block holding the padded tail lane
            assert tail is not None
            src = torch.cat((src, tail))
        work, scratch = y[:count], z[:count]
        torch.add(src, keys[:count], out=work)
        mix_(work, scratch)
        torch.sum(work, dim=0, out=sums[k])
    return sums


def fold(block_sums: torch.Tensor, meta: int) -> torch.Tensor:
    """``F(D + m)`` from one tensor's block sums (0-d int64, on their device)."""
    x = torch.arange(1, block_sums.numel() + 1, dtype=torch.int64, device=block_sums.device)
    x.mul_(_I64["H"]).add_(block_sums)
    d = mix_(x, torch.empty_like(x)).sum().add_(signed(meta))
    return mix_(d, torch.empty_like(d))


def torch_fingerprint(t: torch.Tensor) -> torch.Tensor:
    """0-d int64 fingerprint of one tensor, pure torch, on its own device."""
    return fold(torch_block_sums(t), meta_hash(t.dtype, t.shape))


# --- dispatch ---------------------------------------------------------------------------------------


IMPLS = ("numba", "numpy", "torch", "triton")


def impl_for(device: torch.device) -> str:
    """``DDPJOB_FINGERPRINT_IMPL`` if set, else on the CPU Numba if it imports, else NumPy; on CUDA Triton
    if it imports, else torch."""
    forced = os.environ.get("DDPJOB_FINGERPRINT_IMPL", "").strip().lower()
    if forced and forced not in IMPLS:
        raise ValueError(f"DDPJOB_FINGERPRINT_IMPL={forced!r}: expected one of {', '.join(IMPLS)}")
    if forced in ("numpy", "numba") and device.type != "cpu":
        forced = ""  # NumPy cannot read device memory
    if forced:
        return forced
    if device.type == "cpu":
        from ddp_trainer import fingerprint_numba  # lazy: Numba is optional and compiles on first use

        return "numba" if fingerprint_numba.available() else "numpy"
    if device.type == "cuda":
        from ddp_trainer import fingerprint_triton  # lazy: Triton is optional

        if fingerprint_triton.available():
            return "triton"
    return "torch"


def fingerprint_tensor(t: torch.Tensor) -> torch.Tensor:
    """0-d int64 fingerprint of one tensor, on its own device."""
    return fingerprint_tensors([t])[0]


def _fingerprint_group(tensors: list[torch.Tensor], impl: str) -> torch.Tensor:
    if impl in ("numpy", "numba"):
        compiled = impl == "numba"
        return torch.tensor([numpy_fingerprint(t, compiled=compiled) for t in tensors], dtype=torch.int64)
    if impl == "triton":
        from ddp_trainer import fingerprint_triton

        return fingerprint_triton.fingerprint_tensors(tensors)
    return torch.stack([torch_fingerprint(t) for t in tensors])


def fingerprint_tensors(tensors: Iterable[torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """One int64 per tensor, on ``device`` (default: the first tensor's). No host synchronisation."""
    items = list(tensors)
    if not items:
        return torch.zeros(0, dtype=torch.int64, device=device)
    target = device if device is not None else items[0].device
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(items):
        by_device.setdefault(t.device, []).append(i)
    if len(by_device) == 1:
        return _fingerprint_group(items, impl_for(items[0].device)).to(target)
    out = torch.empty(len(items), dtype=torch.int64, device=target)
    for dev, indices in by_device.items():
        values = _fingerprint_group([items[i] for i in indices], impl_for(dev))
        out[torch.tensor(indices, device=target)] = values.to(target)
    return out
