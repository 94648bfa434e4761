"""The operator's own timer: every few seconds, reconcile every DDPJob the index holds, in one thread.

Kopf's ``@kopf.timer`` would do the same per object, but Kopf puts a finalizer on every object that has a
timer (to stop the timer at deletion): one more write per DDPJob to add it and one to remove it, and its
optimistic patch lost the race against the operator's own status patch twice per DDPJob (422s, retried).
It also keeps an asyncio task per DDPJob. This thread needs neither: a deleted DDPJob leaves the index and
is no longer ticked.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)


class Ticker:
    """Calls ``tick(key)`` for each of ``keys()`` every ``interval`` seconds (from the start of one round
    to the start of the next; a round that takes longer is followed at once by the next), in one daemon
    thread, inside ``context`` (Kopf's context variables, so that ``kopf.event`` works from it). A tick that
    raises is logged and the round goes on. Nothing is ticked while ``paused`` is set. ``after_round`` runs
    after each round (the operator gives freed memory back then: :mod:`ddp_operator.runtime.heap`)."""

    def __init__(
        self,
        interval: float,
        keys: Callable[[], Iterable[Any]],
        tick: Callable[[Any], None],
        paused: threading.Event | None = None,
        after_round: Callable[[], None] | None = None,
    ) -> None:
        self.interval, self.keys, self.tick = interval, keys, tick
        self.after_round = after_round
        self.paused = paused if paused is not None else threading.Event()
        self.stopping = threading.Event()
        self.rounds = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self, context: contextvars.Context | None = None) -> None:
        """Start the thread (once; later calls do nothing)."""
        with self._lock:
            if self._thread is not None:
                return
            run = (context or contextvars.copy_context()).run
            self._thread = threading.Thread(target=run, args=(self._run,), name="ddpjob-ticker", daemon=True)
            self._thread.start()
        log.info("reconciling every DDPJob every %ss (the operator's timer)", self.interval)

    def stop(self, timeout: float = 10) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            if not self.paused.is_set():
                self.round()
                if self.after_round is not None:
                    self.after_round()
            self.stopping.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def round(self) -> None:
        """One tick for every key there is now."""
        for key in _snapshot(self.keys):
            if self.stopping.is_set() or self.paused.is_set():
                return
            try:
                self.tick(key)
            except Exception:
                log.exception("the timer's reconcile of %s failed; it is tried again in the next round", key)
        self.rounds += 1


def _snapshot(keys: Callable[[], Iterable[Any]]) -> list[Any]:
    """``list(keys())``, taken again if the index changed size while being read (Kopf writes it from
    its own thread)."""
    for _ in range(10):
        try:
            return list(keys())
        except RuntimeError:  # dictionary changed size during iteration
            time.sleep(0.01)
    return list(keys())
