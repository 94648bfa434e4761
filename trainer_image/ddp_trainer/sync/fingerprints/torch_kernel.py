"""The fingerprint with torch operations only, on any device (on CUDA: calls under 1 GiB, and every call
where Triton is missing or failed), for many tensors at once, no host synchronisation.

How. Every block of every tensor is one row of a ``(rows, BLOCK)`` int64 chunk
(:mod:`~ddp_trainer.sync.fingerprints.torch_plan`): a large tensor's whole blocks are its own memory viewed so
(direct chunks); the rest is gathered into a chunk buffer by one batched copy (``torch._foreach_copy_``; a
tensor's last, partial block fills its row's front). The lanes get their keys ``(j + 1) * G`` and go
through ``F`` (on CUDA one fused elementwise kernel compiled by torch's own jiterator, NVRTC, that reads
the chunk and writes the terms; elsewhere, or where that cannot compile, eleven in-place int64 operations
on the buffer), the terms past a block's last lane are zeroed, and one ``sum(dim=1)`` gives the block
sums. The fold over blocks and the metadata are vectorised over every tensor (a cumulative sum: integer
addition modulo 2**64 is exact in any order). The host makes about one view per tensor per call (the
plan is cached while the tensors keep their alignment, dtype and shape)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import torch

from ddp_trainer.sync.fingerprints.definition import BLOCK, M1, M2, ROUNDS, G, H, byte_view, signed
from ddp_trainer.sync.fingerprints.torch_plan import Chunk, Geometry, Piece, geometry_for

log = logging.getLogger(__name__)

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


_JIT_SOURCE = """
template <typename T> T ddpjob_keyed_mix(T v, T k) {
  unsigned long long z = (unsigned long long)v + (unsigned long long)k;
  z ^= z >> 30; z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27; z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (T)z;
}
"""
_jit: list[Callable[..., torch.Tensor] | None] = []  # [] untried, [fn] compiled, [None] unavailable


def _fused() -> Callable[..., torch.Tensor] | None:
    """``F(v + k)`` as one CUDA kernel (torch's jiterator), or None where it cannot be built (said once)."""
    if not _jit:
        try:
            from torch.cuda import jiterator

            fn = jiterator._create_jit_fn(_JIT_SOURCE)
            probe = torch.tensor([1, -1], dtype=torch.int64, device="cuda")
            expected = mix_(probe + 5, torch.empty_like(probe))
            if not torch.equal(fn(probe, torch.full_like(probe, 5)), expected):
                raise RuntimeError("the compiled mixer does not match the definition")
            _jit.append(fn)
        except Exception as error:  # no NVRTC, an old torch: the eager operations compute the same bits
            log.warning(
                "fingerprint: no fused torch kernel (%s: %s); eager operations", type(error).__name__, error
            )
            _jit.append(None)
    return _jit[0]


def _buffers(device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys ``(j+1)*G`` for j < B, a ``(rows, B)`` work buffer), cached per device and thread and grown as
    needed. On CUDA they are reused in stream order: use one stream per thread for fingerprints."""
    cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] | None
    cache = getattr(_local, "torch", None)
    if cache is None:
        cache = _local.torch = {}
    have = cache.get(device)
    if have is None or have[1].shape[0] < rows:
        keys = torch.arange(1, BLOCK + 1, dtype=torch.int64, device=device).mul_(_I64["G"])
        cache.pop(device, None)  # free the smaller buffers first
        have = (keys, torch.empty(rows, BLOCK, dtype=torch.int64, device=device))
        cache[device] = have
    return have


def _lane(piece: Piece) -> int:
    """The lane of the chunk buffer (flattened) where ``piece`` starts."""
    return piece.row * BLOCK + piece.start % (8 * BLOCK) // 8


class _Views:
    """Each tensor's bytes and int64 lanes, made when a chunk first needs them (the GPU starts on the first
    chunk while the host makes the next one's); a piece that covers its whole tensor is its view itself."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = tensors
        self._lanes: dict[int, torch.Tensor] = {}
        self._bytes: dict[int, torch.Tensor] = {}

    def bytes(self, i: int) -> torch.Tensor:
        have = self._bytes.get(i)
        if have is None:
            have = self._bytes[i] = byte_view(self.tensors[i])
        return have

    def lanes(self, piece: Piece) -> torch.Tensor:
        """``piece``'s whole lanes (the tensor is 8-byte aligned: only such tensors have lane pieces)."""
        lanes = self._lanes.get(piece.tensor)
        if lanes is None:
            t = self.tensors[piece.tensor].detach()
            if t.numel() * t.element_size() % 8 == 0:
                lanes = t.view(-1).view(torch.int64)  # aligned: the same memory as int64
            else:  # a partial last lane: its bytes go through a raw piece
                lanes = (raw := self.bytes(piece.tensor))[: raw.numel() // 8 * 8].view(torch.int64)
            self._lanes[piece.tensor] = lanes
        if piece.start == 0 and piece.nbytes == 8 * lanes.numel():
            return lanes
        return lanes[piece.start // 8 : (piece.start + piece.nbytes) // 8]


def _block_sums(tensors: Sequence[torch.Tensor], geometry: Geometry, device: torch.device) -> torch.Tensor:
    """``s[b]`` of every block of every tensor, in order (int64 on ``device``)."""
    sums = torch.empty(geometry.blocks, dtype=torch.int64, device=device)  # in the order chunks write them
    if not geometry.blocks:
        return sums
    keys, work = _buffers(device, geometry.rows)
    fused = _fused() if device.type == "cuda" else None
    views = _Views(tensors)
    for chunk in geometry.chunks:
        buf = work[: chunk.rows]
        if chunk.direct:  # the tensor's own memory
            lanes = views.lanes(chunk.lanes[0]).view(chunk.rows, BLOCK)
        else:
            lanes = _gather(chunk, buf, views)
        # the terms go to new memory (fused) or the buffer: never into a tensor read in place
        terms = fused(lanes, keys) if fused else _mixed(torch.add(lanes, keys, out=buf))
        if chunk.tails:  # one basic slice each (cheaper on the host than terms[row, valid:])
            out = terms.view(-1)
            torch._foreach_zero_([out[row * BLOCK + valid : (row + 1) * BLOCK] for row, valid in chunk.tails])
        torch.sum(terms, dim=1, out=sums[chunk.first : chunk.first + chunk.rows])
    if geometry.order is None:
        return sums
    order = geometry.on_device.get("order")
    if order is None:
        order = geometry.on_device["order"] = _ints(geometry.order, device)
    return sums.index_select(0, order)  # a gather: deterministic, no host synchronisation


def _gather(chunk: Chunk, buf: torch.Tensor, views: _Views) -> torch.Tensor:
    """A packed chunk's bytes copied into the rows of ``buf``: one batched copy."""
    flat = buf.view(-1)
    if chunk.raw:  # zero the lanes that bytes only partly fill, then copy the bytes in
        torch._foreach_zero_([flat[_lane(p) :][: -(-p.nbytes // 8)] for p in chunk.raw])
    dst = [flat[p.row * BLOCK : p.row * BLOCK + p.nbytes // 8] for p in chunk.lanes]
    src = [views.lanes(p) for p in chunk.lanes]
    if chunk.raw:
        flat_bytes = flat.view(torch.uint8)
        dst += [flat_bytes[8 * _lane(p) :][: p.nbytes] for p in chunk.raw]
        src += [views.bytes(p.tensor)[p.start : p.start + p.nbytes] for p in chunk.raw]
    if dst:
        torch._foreach_copy_(dst, src)
    return buf


def _mixed(y: torch.Tensor) -> torch.Tensor:
    """``F`` in place by eager operations (no fused kernel here)."""
    return mix_(y, torch.empty_like(y))


def _ints(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` on ``device`` without a host synchronisation (pinned memory, a non-blocking copy: a plain
    ``torch.tensor(values, device="cuda")`` waits for the GPU, which ``set_sync_debug_mode`` catches)."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def fingerprint_many(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One int64 fingerprint per tensor (all on one device), pure torch, on that device."""
    device = tensors[0].device
    flat = tensors if all(t.is_contiguous() for t in tensors) else [t.contiguous() for t in tensors]
    geometry = geometry_for(flat, device)
    sums = _block_sums(flat, geometry, device)
    ints = geometry.on_device
    if "first" not in ints:
        first, count = _ints(geometry.first, device), _ints(geometry.counts, device)
        local = torch.arange(geometry.blocks, dtype=torch.int64, device=device)
        local -= first.repeat_interleave(count, output_size=geometry.blocks)
        ints.update(
            first=first, count=count, keys=(local + 1).mul_(_I64["H"]), metas=_ints(geometry.metas, device)
        )
    first, count = ints["first"], ints["count"]
    x = ints["keys"] + sums
    mix_(x, torch.empty_like(x))
    cumulative = torch.cat(
        (torch.zeros(1, dtype=torch.int64, device=device), torch.cumsum(x, dim=0))
    )  # int64 sums wrap: exact
    d = (cumulative[first + count] - cumulative[first]).add_(ints["metas"])
    return mix_(d, torch.empty_like(d))


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """0-d int64 fingerprint of one tensor, pure torch, on its own device."""
    return fingerprint_many([t])[0]
