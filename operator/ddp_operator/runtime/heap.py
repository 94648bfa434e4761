"""Give the heap the operator freed back to the system: cyclic garbage, then glibc's ``malloc_trim``.

A burst of DDPJobs (a hundred starting at once: their pods' watch events, each a parsed pod of tens of
KiB, queued while the handlers catch up) raises the operator's memory for seconds; CPython frees those
objects (the ones in reference cycles only at a full collection, which a quiet operator rarely reaches),
and glibc keeps the freed pages of its heap mapped, so the resident size stays near the burst's peak.
After a timer round, at most every ``TRIM_EVERY_SECONDS``, :func:`give_back` runs a full collection
(about 30 ms with the operator's modules loaded) and ``malloc_trim(0)``, which returns free pages,
interior ones included. Measured (bench/operator_bench.py, 100 tiny DDPJobs that ran): 156 → 149 MiB.
Where the C library has no ``malloc_trim`` (musl), only the collection runs.

CPython's own small-object allocator (pymalloc) returns an arena only when every object in it is free, so
a few survivors pin the burst's arenas; with ``PYTHONMALLOC=malloc`` every object lives in glibc's heap,
whose free pages ``malloc_trim`` returns wherever they are, and ``MALLOC_ARENA_MAX=2`` keeps the handler
threads to two heaps. The interpreter reads both at start-up only, so `ddpjob operator` starts itself
again with :data:`ALLOCATOR_ENV` (:func:`allocator_env`) unless ``PYTHONMALLOC`` is set. Measured after 100
tiny DDPJobs that ran: 152 MiB on pymalloc, 136 MiB as shipped; what is held costs more (glibc's header per
object): 1000 suspended DDPJobs 209–214 → 235–256 MiB on the code of then, 161–179 MiB since their burst
got cheaper (bench/RESULTS.md, "The allocator" and "The profile").
"""

from __future__ import annotations

import ctypes
import gc
import time
from collections.abc import Callable, Mapping

TRIM_EVERY_SECONDS = 30.0

ALLOCATOR_ENV: Mapping[str, str] = {"PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "2"}
"""The environment the operator runs under: Python's objects in glibc's heap, two heaps at most."""


def allocator_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What ``environ`` lacks of :data:`ALLOCATOR_ENV`; nothing when ``PYTHONMALLOC`` is set (the user's
    choice, or the operator already started again with it)."""
    if "PYTHONMALLOC" in environ:
        return {}
    return {key: value for key, value in ALLOCATOR_ENV.items() if key not in environ}


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_TRIM = _malloc_trim()


def give_back() -> bool:
    """Collect cyclic garbage, then return the heap's free pages to the system; True when some were
    (False: none, or no glibc)."""
    gc.collect()
    return _TRIM is not None and bool(_TRIM(0))


class Trimmer:
    """:func:`give_back`, at most every ``every`` seconds (``clock``: monotonic seconds)."""

    def __init__(
        self, every: float = TRIM_EVERY_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every, self.clock = every, clock
        self._last: float | None = None

    def __call__(self) -> None:
        now = self.clock()
        if self._last is None or now - self._last >= self.every:
            self._last = now
            give_back()
