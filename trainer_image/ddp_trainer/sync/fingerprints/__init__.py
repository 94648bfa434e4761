"""The per-tensor fingerprint: one int64, a pure function of a tensor's raw bits, dtype and shape.

The layers, bottom up: ``definition`` (the hash: its constants, the mixer, the metadata hash, the byte
view); the kernels ``numpy_kernel``, ``numba_kernel``, ``torch_kernel`` and ``triton_kernel``, each
importing the definition and nothing else of this package; ``dispatch``, which chooses a kernel per
device and falls back from a failing compiled one. This module re-exports the API; the library's users
reach it through :mod:`ddp_trainer.sync`.
"""

from __future__ import annotations

from ddp_trainer.sync.fingerprints.definition import BLOCK, G, H, byte_view, meta_hash, mix64
from ddp_trainer.sync.fingerprints.dispatch import (
    IMPLS,
    fingerprint_tensor,
    fingerprint_tensors,
    impl_for,
    numpy_fingerprint,
    torch_fingerprint,
)

__all__ = [
    "BLOCK",
    "IMPLS",
    "G",
    "H",
    "byte_view",
    "fingerprint_tensor",
    "fingerprint_tensors",
    "impl_for",
    "meta_hash",
    "mix64",
    "numpy_fingerprint",
    "torch_fingerprint",
]
