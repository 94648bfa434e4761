"""Which kernel computes a fingerprint, and what happens when a compiled one is missing or fails.

Four kernels compute the same bits (tests check each against an independent NumPy reference):

* Numba (``numba_kernel``), CPU tensors, the default there (from :data:`COMPILED_MIN_BYTES` a call): the
  block sums in one compiled pass (about 4x the NumPy path), with the NumPy fold around them;
* NumPy (``numpy_kernel``), CPU tensors: zero-copy on the tensor's memory, passes of 32K lanes through
  two reused uint64 buffers;
* pure torch (``torch_kernel``), any device: every block of every tensor in a few batched launches (on
  CUDA one fused elementwise kernel by torch's jiterator), no host synchronisation;
* Triton (``triton_kernel``), CUDA, the default there (from :data:`TRITON_MIN_BYTES` a call): one launch
  over a cached table of every block of every tensor, one launch for the per-tensor fold.

``DDPJOB_FINGERPRINT_IMPL=numba|numpy|torch|triton`` forces one (Numba and NumPy: CPU tensors only).
Where NumPy does not import (an image with torch alone, as the no-code-change hook allows), CPU tensors
take the torch path: the same bits.

The fallback. A compiled kernel (Triton, Numba) that raises while it builds or runs is replaced, for the
rest of the process, by the plain path of the same device (torch, NumPy), and the failed call is
computed again there: the check goes on, and since every path computes the same definition, a rank that
fell back still agrees with one that did not. It is said once, as a warning naming the kernel and the
error; Triton missing on a CUDA machine is said once too. :func:`impl_for` names the kernel a large call on
a device gets, before and after (the trainer shows it as the ``fingerprint`` label of ``ddp_info``; calls
under :data:`COMPILED_MIN_BYTES` on the CPU and :data:`TRITON_MIN_BYTES` on CUDA take NumPy and torch). An
error that leaves the CUDA context unusable (an illegal memory access) fails the torch path as well: that
one propagates.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
from collections.abc import Iterable
from types import ModuleType

import torch

from ddp_trainer.sync.fingerprints import torch_kernel

log = logging.getLogger(__name__)

IMPLS = ("numba", "numpy", "torch", "triton")
COMPILED_MIN_BYTES = 1 << 20
"""CPU tensors of fewer bytes in all, in one call, take the NumPy path even where Numba is the CPU kernel
(the same bits): Numba pays off on a model's parameters, but importing it and loading its kernel cost
0.4-0.8 s per process (measured on the CPU machine, the kernel cached on disk), far more than NumPy takes
for a check's control scalars and the structure hash (< 1 ms). So a GPU job, whose only CPU tensors are
those, never loads Numba: its first check, which a Hugging Face ``Trainer`` counts in ``train_runtime``,
is that much shorter."""
TRITON_MIN_BYTES = 1 << 30
"""CUDA tensors of fewer bytes in all, in one call, take the torch path unless Triton is forced (the same
bits). Triton's first kernel in a process costs its import and a hash of its own 500 MB library (Triton's
cache key: 1.25 s on the CPU machine) before it loads a kernel, 0.5-1.5 s that a Hugging Face ``Trainer``
counts in ``train_runtime``; the torch path does a check of up to 1 GiB in about five passes over the
bytes (about 1.5 ms of an H100's bandwidth), so Triton pays off only for larger models, over a long
run."""
FALLBACK = {"triton": "torch", "numba": "numpy"}
"""The plain path that replaces a compiled kernel that failed."""
_broken: dict[str, str] = {}  # kernel -> the error that retired it, for the rest of the process
_said: set[str] = set()


def _say_once(key: str, message: str, *args: object) -> None:
    if key not in _said:
        _said.add(key)
        log.warning(message, *args)


@functools.cache
def _cpu_kernels() -> tuple[ModuleType, ModuleType] | None:
    """The NumPy and Numba kernels' modules, or None where NumPy does not import (said once)."""
    try:
        from ddp_trainer.sync.fingerprints import numba_kernel, numpy_kernel
    except ImportError as error:
        _say_once(
            "numpy-missing", "fingerprint: NumPy does not import (%s); CPU tensors take the torch path", error
        )
        return None
    return numpy_kernel, numba_kernel


def _triton() -> ModuleType | None:
    """The Triton kernel's module where Triton imports and a CUDA device is present, else None (said once)."""
    try:
        from ddp_trainer.sync.fingerprints import triton_kernel
    except Exception as error:  # a broken install can fail with more than ImportError
        reason = f"importing it failed: {type(error).__name__}: {error}"
    else:
        if triton_kernel.available():
            return triton_kernel
        reason = "Triton is not installed"
    _say_no_triton(reason)
    return None


def _say_no_triton(reason: str) -> None:
    _say_once(
        "triton-missing",
        "fingerprint: no Triton kernel on this CUDA device (%s); the torch path computes the same bits",
        reason,
    )


def _triton_expected() -> bool:
    """Whether the Triton kernel serves CUDA tensors, asked without importing Triton where it was not
    imported yet (a process whose calls all stay below :data:`TRITON_MIN_BYTES` never imports it): where
    it is installed but then fails to import, the first large call falls back to torch (said once)."""
    if "ddp_trainer.sync.fingerprints.triton_kernel" in sys.modules:
        return _triton() is not None
    try:
        installed = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken or odd entry in sys.modules
        installed = False
    if not installed:
        _say_no_triton("Triton is not installed")
    return installed


def _forced() -> str:
    """``DDPJOB_FINGERPRINT_IMPL``, lower case ("" when unset); a value that names no kernel raises."""
    forced = os.environ.get("DDPJOB_FINGERPRINT_IMPL", "").strip().lower()
    if forced and forced not in IMPLS:
        raise ValueError(f"DDPJOB_FINGERPRINT_IMPL={forced!r}: expected one of {', '.join(IMPLS)}")
    return forced


def impl_for(device: torch.device, nbytes: int | None = None) -> str:
    """The kernel that fingerprints tensors on ``device`` now: ``DDPJOB_FINGERPRINT_IMPL`` if set, else on
    the CPU Numba if it imports, else NumPy; on CUDA Triton if it imports, else torch — and in place of a
    compiled kernel that failed in this process, its fallback. With ``nbytes`` (one call's bytes in all),
    the kernel of that call: below :data:`COMPILED_MIN_BYTES` NumPy instead of Numba, and on CUDA below
    :data:`TRITON_MIN_BYTES` torch unless Triton is forced (decided before Triton is looked for: such a
    call never imports it)."""
    if nbytes is not None and device.type == "cuda" and nbytes < TRITON_MIN_BYTES and _forced() != "triton":
        return "torch"
    impl = _configured(device)
    if impl == "numba" and nbytes is not None and nbytes < COMPILED_MIN_BYTES:
        return "numpy"
    return impl


def _configured(device: torch.device) -> str:
    forced = _forced()
    cpu = _cpu_kernels() if device.type == "cpu" else None
    if forced in ("numpy", "numba") and cpu is None:
        forced = ""  # NumPy cannot read device memory, and may be missing
    if forced:
        impl = forced
    elif cpu is not None:
        impl = "numba" if cpu[1].available() else "numpy"
    elif device.type == "cuda" and _triton_expected():
        impl = "triton"
    else:
        impl = "torch"
    while impl in _broken:
        impl = FALLBACK[impl]
    return impl


def numpy_fingerprint(t: torch.Tensor, *, compiled: bool = False) -> int:
    """One CPU tensor's fingerprint as a signed int, by NumPy (``compiled``: the block sums by Numba)."""
    kernels = _cpu_kernels()
    if kernels is None:
        raise RuntimeError("NumPy is not available")
    numpy_kernel, numba_kernel = kernels
    result: int = numpy_kernel.fingerprint(
        t, numba_kernel.block_sums if compiled else numpy_kernel.block_sums
    )
    return result


def torch_fingerprint(t: torch.Tensor) -> torch.Tensor:
    """0-d int64 fingerprint of one tensor, pure torch, on its own device."""
    return torch_kernel.fingerprint(t)


def _run(tensors: list[torch.Tensor], impl: str) -> torch.Tensor:
    if impl in ("numpy", "numba"):  # impl_for chose between them by the call's size
        values = [numpy_fingerprint(t, compiled=impl == "numba") for t in tensors]
        return torch.tensor(values, dtype=torch.int64)
    if impl == "triton":
        kernel = _triton()
        if kernel is None:
            raise RuntimeError("Triton is not available")
        result: torch.Tensor = kernel.fingerprint_tensors(tensors)
        return result
    return torch_kernel.fingerprint_many(tensors)


def _fingerprint_group(tensors: list[torch.Tensor], impl: str) -> torch.Tensor:
    """One int64 per tensor (all on one device) with ``impl``, or its fallback if that kernel raises."""
    try:
        return _run(tensors, impl)
    except Exception as error:
        fallback = FALLBACK.get(impl)
        if fallback is None:
            raise
        _broken[impl] = f"{type(error).__name__}: {error}"
        _say_once(
            f"{impl}-failed",
            "fingerprint: the %s kernel failed (%s); the %s path computes the same bits from now on",
            impl,
            _broken[impl],
            fallback,
        )
        return _fingerprint_group(tensors, fallback)


def fingerprint_tensor(t: torch.Tensor) -> torch.Tensor:
    """0-d int64 fingerprint of one tensor, on its own device."""
    return fingerprint_tensors([t])[0]


def _group(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One device's tensors, with the kernel for their size in all."""
    return _fingerprint_group(tensors, impl_for(device, sum(t.numel() * t.element_size() for t in tensors)))


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
        return _group(items, items[0].device).to(target)
    out = torch.empty(len(items), dtype=torch.int64, device=target)
    for dev, indices in by_device.items():
        values = _group([items[i] for i in indices], dev)
        out[torch.tensor(indices, device=target)] = values.to(target)
    return out
