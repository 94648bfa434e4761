"""The fingerprint's block sums on the CPU in one compiled pass (Numba: LLVM, no C compiler needed).

Computes exactly the ``s[b]`` of :mod:`ddp_trainer.sync.fingerprints.definition` (step 3): for each block of
``BLOCK`` lanes, ``sum_j F(v[i] + (j + 1) * G)`` modulo 2**64. One fused loop per block reads each lane
once and keeps the mixer in registers, where the NumPy path needs about ten passes; LLVM vectorises it.
Optional: without Numba the NumPy path runs, with the same bits (a test keeps them equal).
``block_sums`` has the signature of ``numpy_kernel.BlockSums``; ``dispatch`` passes it to
``numpy_kernel.fingerprint``.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import numpy as np

from ddp_trainer.sync.fingerprints.definition import BLOCK, M1, M2


def available() -> bool:
    """Whether Numba is installed (then the CPU fingerprint uses it for large tensors). Asked without
    importing it: importing Numba and loading the kernel cost 0.4-0.8 s, which a process that only ever
    fingerprints a few CPU scalars (a GPU job's control state) should not pay. Should the import fail
    later, :func:`block_sums` raises and the NumPy path takes over (``dispatch``'s fallback)."""
    try:
        return importlib.util.find_spec("numba") is not None
    except (ImportError, ValueError):  # a broken or odd entry in sys.modules
        return False


@functools.cache
def _kernel() -> Any:
    try:
        import numba
    except ImportError:
        return None

    m1, m2 = np.uint64(M1), np.uint64(M2)
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)

    def block_sums(lanes: Any, keys: Any, out: Any) -> None:  # pragma: no cover - compiled
        for b in range(out.size):
            start = b * BLOCK
            block = lanes[start : start + BLOCK]
            s = np.uint64(0)
            for j in range(block.size):
                z = block[j] + keys[j]
                z ^= z >> s30
                z *= m1
                z ^= z >> s27
                z *= m2
                z ^= z >> s31
                s += z
            out[b] = s

    try:  # the compiled code is cached beside the module or in the user's cache folder
        return numba.njit(cache=True, nogil=True)(block_sums)
    except RuntimeError:  # neither is writable (a read-only image as another user): compile per process
        return numba.njit(cache=False, nogil=True)(block_sums)


def block_sums(lanes: np.ndarray, keys: np.ndarray, blocks: int) -> np.ndarray:
    """``s[b]`` for ``blocks`` blocks of the uint64 ``lanes`` (``keys[j] = (j + 1) * G``)."""
    out = np.zeros(blocks, dtype=np.uint64)
    if blocks:
        kernel = _kernel()
        if kernel is None:
            raise RuntimeError("Numba does not import")
        kernel(lanes, keys, out)
    return out
