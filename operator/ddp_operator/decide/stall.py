"""A gang that stopped stepping: which rank holds it up, from the pods' metrics. Pure.

One hung rank (a frozen process, a stuck kernel, a dead peer's socket) holds every other rank in the next
collective until the process group's timeout (``spec.nccl.timeoutSeconds``, 30 minutes by default) fires.
The operator does not wait that long: when rank 0's step has not advanced for ``spec.stallTimeoutSeconds``
(or 20 usual step times, if longer) in its readings while every pod runs, the attempt has stalled; the
message names the pods that stopped answering their metrics (a frozen local rank 0 serves no metrics) and
the ranks whose step count lags the others'.
"""

from __future__ import annotations

from ddp_operator.observe.live import Snapshot, rates

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


def never_started(
    snapshot: Snapshot | None,
    attempt: int,
    running_seconds: float,
    timeout_seconds: int,
    world_size: int,
    built_in: bool,
) -> str | None:
    """Why the attempt has stalled before its first step, or None: every pod has run for
    ``running_seconds``, past ``timeout_seconds`` (``spec.startTimeoutSeconds``; 0: off), and the pods'
    metrics show no step. A reading of this attempt is needed, and a command that exports no metrics is never
    judged: unless it is the built-in trainer (``built_in``, which always does), some rank must have
    answered.
    Names the pods whose trainer does not answer (not started: torchrun's agent starts its workers only
    once every pod has joined the rendezvous) and the ranks that never reported."""
    if not timeout_seconds or running_seconds < timeout_seconds:
        return None
    if snapshot is None or snapshot.attempt != attempt or snapshot.best_step:
        return None
    if not built_in and (snapshot.latest is None or not snapshot.latest.step_times):
        return None
    said = [f"pod {pod} has no trainer answering its metrics yet" for pod in snapshot.refused]
    said += [
        f"pod {entry.split(':')[0]} did not answer its metrics ({entry.split(': ', 1)[-1]})"
        for entry in snapshot.unreachable
    ]
    seen = sorted(int(rank) for rank in (snapshot.latest.step_times if snapshot.latest else {}))
    missing = [rank for rank in range(world_size) if rank not in seen]
    if seen and missing:
        said.append(
            f"rank(s) {', '.join(map(str, missing))} never reported (seen: {', '.join(map(str, seen))})"
        )
    elif not seen:
        said.append(
            "no rank has reported yet: the gang never formed (torchrun's rendezvous, or the process "
            "group's first collective, waits for a rank that did not arrive)"
        )
    return (
        f"no first optimizer step {running_seconds:.0f}s after every pod was running (the limit is "
        f"{timeout_seconds}s, spec.startTimeoutSeconds): {'; '.join(said)}"
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
