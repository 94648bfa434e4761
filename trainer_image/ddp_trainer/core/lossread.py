"""Reading a scalar off the GPU without making the host wait for it: the step's loss, the stop agreement.

``float(loss)`` on a CUDA tensor blocks the host until the GPU has finished every kernel queued so far,
so the next step's data loading and kernel launches cannot overlap this step's work: on an H200 that cost
a third of the step time of a 200 M-parameter MLP (bench/RESULTS.md). :class:`LateRead` instead copies
the scalar into pinned host memory with a non-blocking copy and an event, and hands back the *previous*
one's value when the next one arrives: by then the GPU has usually finished it, and if it has not, the
wait keeps the host at most one step ahead, which is what a training loop wants anyway.
:class:`LossReader` reads a loss so (a CPU loss at once: reading it waits for nothing);
:class:`ddp_trainer.sync.boundary.StopAgreement` reads the ranks' stop flag so.
"""

from __future__ import annotations

import torch

__all__ = ["LateRead", "LossReader"]


class LateRead:
    """CUDA scalars, each read when the next is put: :meth:`put` one, get the one before back."""

    def __init__(self) -> None:
        self._slots: list[tuple[torch.Tensor, torch.cuda.Event]] = []
        self._next = 0
        self._pending: tuple[torch.Tensor, torch.cuda.Event] | None = None

    def put(self, value: torch.Tensor) -> float | None:
        """Queue the copy of ``value`` (a one-element CUDA tensor); return the value put before (None for
        the first), waiting for it only if the GPU has not reached it yet."""
        previous = self.flush()
        if not self._slots:  # two pinned slots: one being written while the other is read
            self._slots = [
                (torch.empty((), dtype=value.dtype, pin_memory=True), torch.cuda.Event())  # type: ignore[no-untyped-call]
                for _ in range(2)
            ]
        host, event = self._slots[self._next]
        self._next ^= 1
        host.copy_(value.reshape(()), non_blocking=True)
        event.record()
        self._pending = (host, event)
        return previous

    def flush(self) -> float | None:
        """The value put last and not yet returned (waits for it), or None."""
        if self._pending is None:
            return None
        host, event = self._pending
        self._pending = None
        event.synchronize()
        return float(host)


class LossReader:
    """One per training loop: :meth:`put` each step's loss, get a finished step's value back."""

    def __init__(self) -> None:
        self._late = LateRead()

    def put(self, loss: torch.Tensor) -> float | None:
        """Hand over this step's loss (a scalar tensor). Returns the loss of the step before on CUDA (None
        for the first), this step's on other devices."""
        value = loss.detach().float().sum()
        return self._late.put(value) if value.device.type == "cuda" else float(value)

    def flush(self) -> float | None:
        """The loss handed over last and not yet returned (waits for it), or None."""
        return self._late.flush()
