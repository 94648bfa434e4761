"""A gang that stopped stepping: which rank holds it up, from the pods' metrics. Pure.

One hung rank (a frozen process, a stuck kernel, a dead peer's socket) holds every other rank in the next
collective until the process group's timeout (``spec.nccl.timeoutSeconds``, 30 minutes by default) fires.
The operator does not wait that long: when rank 0's step has not advanced for ``spec.stallTimeoutSeconds``
(or 20 usual step times, if longer) in its readings while every pod runs, the attempt has stalled; the
message names the pods that stopped answering their metrics (a frozen local rank 0 serves no metrics) and
the ranks whose step count lags the others'.
"""

from __future__ import annotations

from .live import Snapshot, rates

STEP_TIMES = 20
"""The limit is at least this many usual step times (slow models step slowly)."""


def limit_seconds(snapshot: Snapshot, timeout_seconds: int) -> float:
    """``timeout_seconds``, or 20 usual step times when that is longer."""
    steps_per_second, _ = rates(snapshot)
    usual = 1 / steps_per_second if steps_per_second else 0.0
    return max(float(timeout_seconds), STEP_TIMES * usual)


def stalled(snapshot: Snapshot | None, attempt: int, timeout_seconds: int) -> str | None:
    """Why the attempt has stalled, or None (no reading of it, no step yet, stepping, or disabled)."""
    if not timeout_seconds or snapshot is None or snapshot.attempt != attempt or not snapshot.best_step:
        return None
    age = snapshot.at - snapshot.advanced_at
    limit = limit_seconds(snapshot, timeout_seconds)
    if age < limit:
        return None
    return (
        f"no optimizer step for {age:.0f}s (rank 0 at step {snapshot.best_step}; the limit is {limit:.0f}s, "
        f"spec.stallTimeoutSeconds): {culprits(snapshot)}"
    )


def culprits(snapshot: Snapshot) -> str:
    """The pods that did not answer their metrics, and the ranks behind the others."""
    said = [
        f"pod {entry.split(':')[0]} did not answer its metrics ({entry.split(': ', 1)[-1]})"
        for entry in snapshot.unreachable
    ]
    counts = {
        rank: int(count)
        for rank, (_, count) in (snapshot.latest.step_times if snapshot.latest else {}).items()
    }
    if counts:
        most = max(counts.values())
        said += [
            f"rank {rank} is at step {n} of {most}"
            for rank, n in sorted(counts.items(), key=lambda kv: int(kv[0]))
            if n < most
        ]
    return "; ".join(said) or "every rank answered at the same step: a collective holds them all"
