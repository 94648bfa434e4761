"""Where a person watches ``ddpjob local``: the live progress line on a terminal (a line every 10 s in a
log), each pod's output when shown, and Ctrl-C (or SIGTERM): once to stop gracefully, twice to kill."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO


@dataclass
class Console:
    """Where a person watches: a live progress line on a terminal, a line every 10 s in a log; either only
    when the step changed (a script that validates, or waits, for a while says its step once)."""

    stream: TextIO
    verbose: bool
    shown: frozenset[str] = frozenset()
    """Pods whose output is shown without --verbose (rank 0 of a custom command, as `kubectl logs`)."""
    stopping: bool = False
    """ddpjob is stopping the pods (SIGTERM): what they print now is labelled as that stop's doing."""
    _last_plain: float | None = None
    _live: bool = False
    _last_step: int | None = None

    def say(self, text: str) -> None:
        if self._live:
            print("\r\x1b[2K", end="", file=self.stream)
            self._live = False
        print(text, file=self.stream, flush=True)

    def pod_line(self, pod: str, text: str) -> None:
        if self.verbose or pod in self.shown:
            self.say(f"[{pod}, after ddpjob's SIGTERM] {text}" if self.stopping else f"[{pod}] {text}")

    def progress(self, text: str, step: int) -> None:
        if step == self._last_step:
            return
        if self.stream.isatty():
            print(f"\r\x1b[2K{text}", end="", file=self.stream, flush=True)
            self._live, self._last_step = True, step
        elif self._last_plain is None:
            self._last_plain = time.monotonic()  # the first line after 10 s of training, then every 10 s
        elif time.monotonic() - self._last_plain >= 10.0:
            self._last_plain, self._last_step = time.monotonic(), step
            self.say(text)


@dataclass
class Interrupt:
    """Ctrl-C (or SIGTERM) once: stop gracefully; twice: kill at once."""

    count: int = 0
    previous: dict[int, Any] = field(default_factory=dict)

    def __enter__(self) -> Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
