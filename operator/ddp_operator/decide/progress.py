"""Progress, one room of the decision: what the status says of a running attempt's progress, and whether
the gang stopped stepping. Pure.

- :func:`stall_or_reading`: a running attempt's one entrance: a stall (below), else its reading written,
  the reading's rates computed once for both;
- :func:`write_reading`: the latest metrics reading (:mod:`ddp_operator.observe.live`) as
  ``status.progress`` (:func:`progress_status`), the live ``status.sync`` and its events
  (:mod:`~ddp_operator.decide.sync_check`), the ``MetricsScraped`` condition, at most every
  :data:`STATUS_SECONDS` per job, so a reconcile with nothing else new writes nothing;
- an end: :func:`final_progress` (nothing left to wait for) and :func:`completed_message` (the Succeeded
  event: total time and throughput);
- a stall (:func:`stalled`): one hung rank (a frozen process, a stuck kernel, a dead peer's
  socket) holds every other rank in the next collective until the process group's timeout
  (``spec.nccl.timeoutSeconds``, 30 minutes by default) fires. The operator does not wait that long: when
  rank 0's step has not advanced for ``spec.stallTimeoutSeconds`` (or 20 usual step times, if longer) in
  its readings while every pod runs, the attempt has stalled (:func:`stalled`); the message names the pods
  that stopped answering their metrics (a frozen local rank 0 serves no metrics) and the ranks whose step
  count lags the others'. A gang that never stepped within ``spec.startTimeoutSeconds`` of running has
  stalled too (:func:`never_started`).

Long because the reading and the stall go on from the same snapshot and its rates, read best side by side.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping
from typing import Any

from ddp_operator.api import reasons, typed_status
from ddp_operator.api.spec import Spec, known_total_steps
from ddp_operator.api.typed_status import Status
from ddp_operator.decide import sync_check
from ddp_operator.decide.status_builder import Parts, Said, Section, StatusBuilder, parse_time
from ddp_operator.observe.live import Snapshot, rates
from ddp_operator.observe.metrics import duration, slowest

METRICS_SCRAPED = reasons.METRICS_SCRAPED
"""The condition that says whether the pods' metrics could be read."""
STATUS_SECONDS = 10.0
"""At most one change of ``status.progress`` per job in this time."""
Rates = Callable[[], tuple[float | None, float | None]]
"""A snapshot's steps and samples per second (:func:`~ddp_operator.observe.live.rates`), read when asked: a
function given them (``speed``) reads the rates through it, and reads them itself without it."""


def stall_or_reading(
    out: StatusBuilder, spec: Spec, snapshot: Snapshot | None, attempt: int, now: dt.datetime, running: bool
) -> str | None:
    """Why a ``running`` gang has stalled (:func:`stalled`), or never stepped since its pods all ran
    (:func:`never_stepped`); else None, once the attempt's reading is written (:func:`write_reading`). The
    reading's rates are computed once, when the first of the two asks."""
    speed = functools.cache(functools.partial(rates, snapshot)) if snapshot is not None else None
    if running and (why := stalled(snapshot, attempt, spec.stall_timeout_seconds, speed)):
        return why
    if running and (why := never_stepped(out, spec, snapshot, attempt, now)):
        return why
    write_reading(out, snapshot, attempt, known_total_steps(spec), speed)
    return None


# -- a running attempt's readings ---------------------------------------------------------------------


def write_reading(
    out: StatusBuilder, snapshot: Snapshot | None, attempt: int, total_steps: int, speed: Rates | None = None
) -> None:
    """Write a fresh reading into the status, at most every :data:`STATUS_SECONDS`; keep the last one
    otherwise. Posts the events of what changed since (:func:`reading`)."""
    out.say(reading(out, snapshot, attempt, total_steps, speed))


def reading(
    out: StatusBuilder, snapshot: Snapshot | None, attempt: int, total_steps: int, speed: Rates | None = None
) -> Said:
    """What the status (``out``: its builder) says of a running attempt's reading: the previous
    ``status.progress``, as stored, until a fresh reading (none written within :data:`STATUS_SECONDS` of the
    previous one) replaces it, with the ``MetricsScraped`` condition and the live ``status.sync`` (going on
    from the one written so far) and its events. Each case reads from the builder what it needs."""
    progress = out.last.progress
    if snapshot is None or snapshot.attempt != attempt:
        return _kept(out)
    written = parse_time(progress.computed_at) if progress is not None else None
    if written is not None and snapshot.at - written.timestamp() < STATUS_SECONDS:
        return _kept(out)
    fresh = dict(progress=Parts(typed_status.Progress, progress_parts(snapshot, total_steps, speed)))
    sync = out.stored("sync", written=True)
    live = sync_check.live(sync or {}, snapshot.latest, attempt) if snapshot.latest is not None else Said()
    return Said(
        {**fresh, **live.fields},
        keep_conditions=(METRICS_SCRAPED,),
        conditions=(_scraped(snapshot),),
        events=live.events,
    )


def _kept(out: StatusBuilder) -> Said:
    """The previous ``status.progress`` kept as stored (a mapping), with the ``MetricsScraped`` condition."""
    kept = out.stored("progress")
    return Said(
        dict(progress=dict(kept)) if isinstance(kept, dict) else {}, keep_conditions=(METRICS_SCRAPED,)
    )


def progress_status(snapshot: Snapshot, total_steps: int, speed: Rates | None = None) -> dict[str, Any]:
    """``status.progress`` from a snapshot (only the fields the metrics tell), as the builder writes it."""
    return Section.of(typed_status.Progress, *progress_parts(snapshot, total_steps, speed))


def progress_parts(
    snapshot: Snapshot, total_steps: int, speed: Rates | None = None
) -> tuple[dict[str, Any], ...]:
    """:func:`progress_status`'s parts, in order, as the room says them (:class:`Parts`)."""
    parts: list[dict[str, Any]] = [dict(computed_at=dt.datetime.fromtimestamp(snapshot.at, dt.UTC))]
    if snapshot.refused or snapshot.unreachable:
        pods = [*snapshot.refused, *(u.split(":")[0] for u in snapshot.unreachable)]
        parts.append(dict(unreachable=sorted(pods)[:64]))
    now = snapshot.latest
    if now is None:
        return tuple(parts)
    total_steps = now.total_steps or total_steps  # the code's own total where it says (a Trainer's max_steps)
    if total_steps:
        percent = min(100, int(100 * now.step / total_steps))
        parts.append(dict(step=now.step, total_steps=total_steps, percent=percent, summary=f"{percent}%"))
    else:  # nobody says how many steps there will be: the step, the rates, no percent or ETA
        parts.append(dict(step=now.step, summary=f"step {now.step}"))
    steps_per_s, samples_per_s = speed() if speed is not None else rates(snapshot)
    if samples_per_s is not None:
        parts.append(dict(samples_per_second=round(samples_per_s, 1)))
    if steps_per_s:
        parts.append(dict(steps_per_second=round(steps_per_s, 3)))
    if steps_per_s and total_steps:
        eta = max(0, total_steps - now.step) / steps_per_s
        parts.append(
            dict(
                eta_seconds=round(eta),
                eta=duration(eta),
                eta_time=dt.datetime.fromtimestamp(snapshot.at + eta, dt.UTC),
            )
        )
    if now.loss is not None:
        parts.append(dict(loss=now.loss))
    if now.nonfinite_steps:
        parts.append(dict(nonfinite_loss_steps=now.nonfinite_steps))
    if (found := slowest(now, snapshot.earlier)) is not None:
        parts.append(dict(slowest_rank=found[0], slowest_step_seconds=round(found[1], 6)))
    if now.skew is not None:
        parts.append(dict(step_time_skew=round(now.skew, 4)))
    return tuple(parts)


def _scraped(snapshot: Snapshot) -> tuple[str, bool | None, str, str]:
    """The ``MetricsScraped`` condition: how many pods answered."""
    port, asked = snapshot.port, snapshot.pods
    answered = asked - len(snapshot.refused) - len(snapshot.unreachable)
    if answered and answered == asked:
        return METRICS_SCRAPED, True, "Scraped", f"read the metrics of {answered}/{asked} pods on port {port}"
    if answered:
        missing = ", ".join([*snapshot.refused, *snapshot.unreachable])
        return METRICS_SCRAPED, True, "PartlyUnreachable", f"{answered}/{asked} pods answered; not: {missing}"
    if snapshot.unreachable:
        why = "; ".join(snapshot.unreachable)
        message = (
            f"no pod answered on port {port} ({why}): no progress to show; a NetworkPolicy must let the "
            "operator reach the pods on this port (docs/operator.md)"
        )
        return METRICS_SCRAPED, False, "Unreachable", message
    message = (
        f"nothing listens on port {port} in the pods (yet): the command exports no metrics, so there "
        "is no progress to show"
    )
    return METRICS_SCRAPED, False, "NoMetrics", message


# -- an end -------------------------------------------------------------------------------------------


def completed_message(previous: Mapping[str, Any], attempt: int, now: dt.datetime, steps: int | None) -> str:
    """The Succeeded event: total time and throughput."""
    last = typed_status.read(previous)
    started = parse_time(last.start_time)
    took = f" in {duration((now - started).total_seconds())}" if started else ""
    rate = last.progress.samples_per_second if last.progress is not None else None
    throughput = f", {rate:,.0f} samples/s" if isinstance(rate, (int, float)) else ""
    done = f": {steps} steps" if steps is not None else ""
    return f"attempt {attempt} completed{took}{done}{throughput}"


def final_progress(
    previous: Mapping[str, Any], step: int | None, total_steps: int, now: str
) -> dict[str, Any] | None:
    """``status.progress`` once the job has succeeded: the report's step, nothing left to wait for."""
    kept = Section(Status, dict(previous)).stored("progress")
    if step is None:
        return dict(kept) if isinstance(kept, dict) else None
    percent = min(100, int(100 * step / total_steps)) if total_steps else 100
    out = Section(typed_status.Progress, dict(kept) if isinstance(kept, dict) else {})
    out.set(step=step, total_steps=total_steps or step)
    out.set(percent=percent, summary=f"{percent}%", eta_seconds=0, eta="0s", computed_at=now)
    out.drop("eta_time", "unreachable")
    return out.values


# -- a stall ------------------------------------------------------------------------------------------

STEP_TIMES = 20
"""The limit is at least this many usual step times (slow models step slowly)."""


def limit_seconds(snapshot: Snapshot, timeout_seconds: int, speed: Rates | None = None) -> float:
    """``timeout_seconds``, or 20 usual step times when that is longer."""
    steps_per_second, _ = speed() if speed is not None else rates(snapshot)
    usual = 1 / steps_per_second if steps_per_second else 0.0
    return max(float(timeout_seconds), STEP_TIMES * usual)


def stalled(
    snapshot: Snapshot | None, attempt: int, timeout_seconds: int, speed: Rates | None = None
) -> str | None:
    """Why the attempt has stalled, or None (no reading of it, no step yet, stepping, or disabled)."""
    if not timeout_seconds or snapshot is None or snapshot.attempt != attempt or not snapshot.best_step:
        return None
    age = snapshot.at - snapshot.advanced_at
    limit = limit_seconds(snapshot, timeout_seconds, speed)
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


def never_stepped(
    out: StatusBuilder, spec: Spec, snapshot: Snapshot | None, attempt: int, now: dt.datetime
) -> str | None:
    """Why a running gang never stepped since its pods all ran (since the ``Ready`` condition turned True:
    :func:`never_started`), or None (``spec.startTimeoutSeconds`` off, not yet, or it stepped)."""
    if not (timeout := spec.start_timeout_seconds):
        return None  # off
    since = out.changed_at(reasons.READY)
    running = (now - since).total_seconds() if since else 0.0
    if running < timeout:
        return None  # not yet
    built_in = spec.command is None and spec.args is None and spec.metrics_port != 0
    return never_started(snapshot, attempt, running, timeout, spec.world_size, built_in)
