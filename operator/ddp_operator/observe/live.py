"""A running job's metrics readings: what each pod answered, the latest :class:`Snapshot` of a DDPJob's
pods with an earlier one of the same run, and the rates between them. Pure.

:mod:`ddp_operator.runtime.scraper` reads the pods' ``/metrics`` outside any reconcile and keeps the latest
:class:`Snapshot` per DDPJob; the reconcile hands it to :func:`ddp_operator.decide.decision.decide` in its
:class:`~ddp_operator.observe.observation.Observation`, and :mod:`ddp_operator.decide.progress` writes
it into ``status.progress`` and the live ``status.sync``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddp_operator.observe.metrics import Progress


@dataclass(frozen=True)
class Target:
    """A pod whose metrics to read: its name, completion index and ``http://<podIP>:<port>/metrics``."""

    pod: str
    index: int
    url: str


RATE_WINDOW_SECONDS = 60.0
"""Rates are measured between the newest reading and one at most this old (then the window moves)."""


@dataclass(frozen=True)
class Answer:
    """What one pod said: the exposition text, or why there is none."""

    pod: str
    text: str | None
    refused: bool = False
    """Nothing listens on the port (the command exports no metrics, or has not started to)."""
    error: str = ""


@dataclass(frozen=True)
class Snapshot:
    """The latest reading of one DDPJob's pods, with an earlier one of the same run for rates."""

    attempt: int
    at: float
    """Unix time of the reading."""
    port: int
    pods: int
    refused: tuple[str, ...]
    unreachable: tuple[str, ...]
    """``<pod>: <why>`` for each pod that did not answer in time (or answered garbage)."""
    latest: Progress | None
    """Parsed from every pod that answered; None when none did."""
    earlier: Progress | None = None
    earlier_at: float = 0.0
    best_step: int = 0
    """The highest step rank 0 reported in this attempt."""
    advanced_at: float = 0.0
    """Unix time of the reading that first showed ``best_step`` (0 before any step)."""


def record(
    previous: Snapshot | None,
    attempt: int,
    port: int,
    answers: Sequence[Answer],
    at: float,
    latest: Progress | None,
) -> Snapshot:
    """The new snapshot: keeps an earlier reading of the same attempt for rates, drops it when the
    counters went backwards (a rank restarted inside the attempt) or it left the window."""
    earlier, earlier_at = None, 0.0
    if previous is not None and previous.attempt == attempt and latest is not None:
        base, base_at = previous.earlier, previous.earlier_at
        if base is None or at - base_at > RATE_WINDOW_SECONDS:
            base, base_at = previous.latest, previous.at
        if base is not None and latest.step >= base.step and latest.samples >= base.samples:
            earlier, earlier_at = base, base_at
    best, since = 0, 0.0
    if previous is not None and previous.attempt == attempt:
        best, since = previous.best_step, previous.advanced_at
    if latest is not None and latest.step > best:
        best, since = latest.step, at
    return Snapshot(
        best_step=best,
        advanced_at=since,
        attempt=attempt,
        at=at,
        port=port,
        pods=len(answers),
        refused=tuple(a.pod for a in answers if a.text is None and a.refused),
        unreachable=tuple(f"{a.pod}: {a.error}" for a in answers if a.text is None and not a.refused),
        latest=latest,
        earlier=earlier,
        earlier_at=earlier_at,
    )


def rates(snapshot: Snapshot) -> tuple[float | None, float | None]:
    """Steps and samples per second between the two readings, or from the step-time histogram before
    there are two."""
    now, before = snapshot.latest, snapshot.earlier
    if now is None:
        return None, None
    elapsed = snapshot.at - snapshot.earlier_at
    if before is not None and elapsed > 0 and now.step > before.step:
        return (now.step - before.step) / elapsed, (now.samples - before.samples) / elapsed
    steps = now.steps_per_second()
    if steps is None:
        return None, None
    done = sum(count for _, count in now.step_times.values())
    per_step = now.samples / done * len(now.step_times) if done else None
    return steps, steps * per_step if per_step is not None else None
