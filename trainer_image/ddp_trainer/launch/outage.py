"""An elastic agent that must meet the others while its rendezvous store does not answer: the store's pod
was lost and its replacement is not ready yet, and meanwhile this node's workers failed, a peer was lost or
left, or one joined. torch's rendezvous then ends with the store's error (``RendezvousConnectionError``),
which would end the pod; instead the agent waits for the store, saying what it waits for and for how long,
reaches it again once it answers (a new client, the round given back to a store that came back empty,
:meth:`ddp_trainer.launch.rounds.RoundWatch.restore`), and meets the others there at the next round. It waits
as long as a pod that starts before its store does (:data:`ddp_trainer.launch.store.WAIT_SECONDS`); then
the pod fails, as a crash, and is replaced.

:class:`StoreWait` is pure (its clock and its words given); :func:`reach` goes through the round's watch."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from ddp_trainer.launch.store import WAIT_SAY_EVERY, WAIT_SECONDS

POLL_SECONDS = 0.5
"""How often a waiting agent tries the store again."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _first_line(exc: BaseException) -> str:
    cause = exc.__cause__
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{text}; {str(cause).splitlines()[0]}" if cause is not None and str(cause) else text


class StoreWait:
    """One wait of an agent for its rendezvous store (at ``where``) before its next round."""

    def __init__(
        self,
        where: str,
        limit: float = WAIT_SECONDS,
        say: Callable[[str], None] = _say,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.where, self.limit, self.say, self.clock = where, limit, say, clock
        self.started = self.last_said = clock()
        self.misses = 0
        self.reached_at: float | None = None

    def waited(self) -> float:
        return self.clock() - self.started

    def missed(self, exc: BaseException) -> bool:
        """The store did not answer (``exc``, its error): True to try again after :data:`POLL_SECONDS`, said
        the first time and every :data:`WAIT_SAY_EVERY` seconds; False once ``limit`` passed (said too)."""
        now, first = self.clock(), _first_line(exc)
        waited = now - self.started
        if self.misses == 0:
            self.say(
                f"[launcher] the rendezvous store at {self.where} does not answer as this node meets the "
                f"others at the next round ({first}): waiting for it, up to {self.limit:.0f} s (a lost "
                "store's pod is replaced by its Job); the world re-forms once it answers"
            )
        elif waited >= self.limit:
            self.say(
                f"[launcher] the rendezvous store at {self.where} did not answer in {self.limit:.0f} s "
                f"({first}): this pod fails (exit 1) and is replaced"
            )
            return False
        elif now - self.last_said >= WAIT_SAY_EVERY:
            self.last_said = now
            self.say(
                f"[launcher] still waiting for the rendezvous store at {self.where}: {waited:.0f} s of "
                f"{self.limit:.0f} s"
            )
        self.misses += 1
        return True

    def reached(self) -> None:
        """This agent reached the store again (:func:`reach`)."""
        self.reached_at = self.clock()

    def answered(self) -> None:
        """Said once the round was met through the store that answers again: how long the store did not
        answer, and how long the round took after."""
        now = self.clock()
        reached = self.reached_at if self.reached_at is not None else now
        self.say(
            f"[launcher] the rendezvous store at {self.where} answered again after "
            f"{reached - self.started:.0f} s; this node met the others at the next round "
            f"{now - reached:.0f} s later"
        )


def reach(watch: Any) -> bool:
    """One try to reach the store again through ``watch`` (a :class:`~ddp_trainer.launch.rounds.RoundWatch`):
    a new client once it accepts a connection, its last view of its round written back if the store came
    back empty, and this agent announced to the store's process watch. False while the store does not
    answer."""
    try:
        watch.reconnect()
        if watch.read_state() is None:
            watch.restore()
        if watch.presence:
            watch.announce()
    except Exception:  # the store's errors, a connection refused: not yet
        return False
    watch.failed_reads = 0  # reached: the watch's next poll reads through this client, no new one
    return True
