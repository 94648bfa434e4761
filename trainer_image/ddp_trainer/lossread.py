"""Reading a step's loss off the GPU without making the host wait for it.

``float(loss)`` on a CUDA tensor blocks the host until the GPU has finished every kernel queued so far,
so the next step's data loading and kernel launches cannot overlap this step's work: on an H200 that cost
a third of the step time of a 200 M-parameter MLP (bench/RESULTS.md). :class:`LossReader` instead copies
the loss into pinned host memory with a non-blocking copy and an event, and hands back the *previous*
step's value when the next one arrives: by then the GPU has usually finished it, and if it has not, the
wait keeps the host at most one step ahead, which is what a training loop wants anyway. A CPU loss is read
at once (reading it does not wait for anything).
"""

from __future__ import annotations

import torch

__all__ = ["LossReader"]


class LossReader:
    """One per training loop: :meth:`put` each step's loss, get a finished step's value back."""

    def __init__(self) -> None:
        self._slots: list[tuple[torch.Tensor, torch.cuda.Event]] = []
        self._next = 0
        self._pending: tuple[torch.Tensor, torch.cuda.Event] | None = None

    def put(self, loss: torch.Tensor) -> float | None:
        """Hand over this step's loss (a scalar tensor). Returns the loss of the step before on CUDA (None
        for the first), this step's on other devices."""
        value = loss.detach()
        if value.device.type != "cuda":
            return float(value.float().sum())
        previous = self.flush()
        if not self._slots:  # two pinned slots: one being written while the other is read
            self._slots = [
                (torch.empty((), dtype=torch.float32, pin_memory=True), torch.cuda.Event())  # type: ignore[no-untyped-call]
                for _ in range(2)
            ]
        host, event = self._slots[self._next]
        self._next ^= 1
        host.copy_(value.float().sum(), non_blocking=True)
        event.record()
        self._pending = (host, event)
        return previous

    def flush(self) -> float | None:
        """The value handed over last and not yet returned (waits for it), or None."""
        if self._pending is None:
            return None
        host, event = self._pending
        self._pending = None
        event.synchronize()
        return float(host)
