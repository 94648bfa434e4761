"""The fingerprint with torch operations only, on any device (the fallback on CUDA without a working
Triton kernel): in-place vector operations on int64, logical shifts emulated with a mask, no host
synchronisation.
"""

from __future__ import annotations

import threading

import torch

from ddp_trainer.fingerprint.definition import BLOCK, M1, M2, ROUNDS, G, H, byte_view, meta_hash, signed

_I64 = {name: signed(value) for name, value in (("G", G), ("H", H), ("M1", M1), ("M2", M2))}
_SIGNED_ROUNDS = tuple((shift, signed(mult)) for shift, mult in ROUNDS)
_local = threading.local()  # buffers per thread, so concurrent callers do not share them


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


def block_sums(t: torch.Tensor) -> torch.Tensor:
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


def fold(sums: torch.Tensor, meta: int) -> torch.Tensor:
    """``F(D + m)`` from one tensor's block sums (0-d int64, on their device)."""
    x = torch.arange(1, sums.numel() + 1, dtype=torch.int64, device=sums.device)
    x.mul_(_I64["H"]).add_(sums)
    d = mix_(x, torch.empty_like(x)).sum().add_(signed(meta))
    return mix_(d, torch.empty_like(d))


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """0-d int64 fingerprint of one tensor, pure torch, on its own device."""
    return fold(block_sums(t), meta_hash(t.dtype, t.shape))
