"""A running job's metrics → ``status.progress``, the live part of ``status.sync``, and the events a person
wants (first good sync check, a divergence, a repair). Pure.

:mod:`ddp_operator.scraper` reads the pods' ``/metrics`` outside any reconcile and keeps the latest
:class:`Snapshot` per DDPJob; the reconcile hands it to :func:`ddp_operator.reconcile.decide` as one more
input. The status changes at most every :data:`STATUS_SECONDS` per job, so a reconcile with nothing else
new writes nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .plan import Event, StatusBuilder, parse_time, stamp
from .progress import Progress, duration, slowest

STATUS_SECONDS = 10.0
"""At most one change of ``status.progress`` per job in this time."""
RATE_WINDOW_SECONDS = 60.0
"""Rates are measured between the newest reading and one at most this old (then the window moves)."""
CONDITION = "MetricsScraped"


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


def progress_status(snapshot: Snapshot, total_steps: int) -> dict[str, Any]:
    """``status.progress`` from a snapshot (only the fields the metrics tell)."""
    out: dict[str, Any] = {"computedAt": stamp(dt.datetime.fromtimestamp(snapshot.at, dt.UTC))}
    if snapshot.refused or snapshot.unreachable:
        pods = [*snapshot.refused, *(u.split(":")[0] for u in snapshot.unreachable)]
        out["unreachable"] = sorted(pods)[:64]
    now = snapshot.latest
    if now is None:
        return out
    total_steps = now.total(total_steps)  # the code's own total where it says (e.g. a Trainer's max_steps)
    percent = min(100, int(100 * now.step / total_steps)) if total_steps else 0
    out.update(step=now.step, totalSteps=total_steps, percent=percent, summary=f"{percent}%")
    steps_per_s, samples_per_s = rates(snapshot)
    if samples_per_s is not None:
        out["samplesPerSecond"] = round(samples_per_s, 1)
    if steps_per_s:
        out["stepsPerSecond"] = round(steps_per_s, 3)
        eta = max(0, total_steps - now.step) / steps_per_s
        out.update(
            etaSeconds=round(eta),
            eta=duration(eta),
            etaTime=stamp(dt.datetime.fromtimestamp(snapshot.at + eta, dt.UTC)),
        )
    if now.loss is not None:
        out["loss"] = now.loss
    if now.nonfinite_steps:
        out["nonfiniteLossSteps"] = now.nonfinite_steps
    if (found := slowest(now, snapshot.earlier)) is not None:
        out.update(slowestRank=found[0], slowestStepSeconds=round(found[1], 6))
    if now.skew is not None:
        out["stepTimeSkew"] = round(now.skew, 4)
    return out


def sync_status(previous: Mapping[str, Any], now: Progress) -> dict[str, Any]:
    """``status.sync`` while the job runs: the live count of checks, the last one's step, time and verdict."""
    checks = now.checks_ok + now.checks_mismatch
    out = dict(previous)
    if not checks:
        return out
    out.update(checks=checks, mismatches=now.checks_mismatch, repairs=now.repairs)
    if now.last_check_ok is not None:
        out["lastCheckResult"] = "BitIdentical" if now.last_check_ok else "Diverged"
        out["verified"] = now.last_check_ok and now.checks_mismatch <= now.repairs
    if now.last_check_time is not None:
        out["lastCheckTime"] = stamp(dt.datetime.fromtimestamp(now.last_check_time, dt.UTC))
    if now.last_check_step is not None:
        out["lastCheckStep"] = now.last_check_step
    return out


def update(out: StatusBuilder, snapshot: Snapshot | None, attempt: int, total_steps: int) -> None:
    """Write a fresh reading into the status, at most every :data:`STATUS_SECONDS`; keep the last one
    otherwise. Posts the events of what changed since."""
    previous = out.previous
    kept = previous.get("progress")
    if isinstance(kept, dict):
        out.values["progress"] = dict(kept)
    old_condition = {c.get("type"): c for c in previous.get("conditions", []) or []}.get(CONDITION)
    if old_condition:
        out.conditions[CONDITION] = dict(old_condition)
    if snapshot is None or snapshot.attempt != attempt:
        return
    written = parse_time(kept.get("computedAt")) if isinstance(kept, dict) else None
    if written is not None and snapshot.at - written.timestamp() < STATUS_SECONDS:
        return
    out.values["progress"] = progress_status(snapshot, total_steps)
    _condition(out, snapshot)
    if snapshot.latest is not None:
        old_sync = out.values.get("sync") or {}
        new_sync = sync_status(old_sync, snapshot.latest)
        if new_sync:
            out.values["sync"] = new_sync
        out.events.extend(_sync_events(old_sync, new_sync, snapshot.latest))


def _condition(out: StatusBuilder, snapshot: Snapshot) -> None:
    port, asked = snapshot.port, snapshot.pods
    answered = asked - len(snapshot.refused) - len(snapshot.unreachable)
    if answered and answered == asked:
        out.condition(
            CONDITION, True, "Scraped", f"read the metrics of {answered}/{asked} pods on port {port}"
        )
    elif answered:
        missing = ", ".join([*snapshot.refused, *snapshot.unreachable])
        out.condition(
            CONDITION, True, "PartlyUnreachable", f"{answered}/{asked} pods answered; not: {missing}"
        )
    elif snapshot.unreachable:
        why = "; ".join(snapshot.unreachable)
        message = (
            f"no pod answered on port {port} ({why}): no progress to show; a NetworkPolicy must let the "
            "operator reach the pods on this port (docs/operator.md)"
        )
        out.condition(CONDITION, False, "Unreachable", message)
    else:
        message = (
            f"nothing listens on port {port} in the pods (yet): the command exports no metrics, so there "
            "is no progress to show"
        )
        out.condition(CONDITION, False, "NoMetrics", message)


def _sync_events(old: Mapping[str, Any], new: Mapping[str, Any], now: Progress) -> list[Event]:
    """What changed since the last written reading (the gauges describe the last check only)."""
    events = []
    step = new.get("lastCheckStep", now.step)
    if not old.get("checks") and now.checks_ok and now.last_check_ok:
        message = (
            f"first sync check passed: every rank holds a bit-identical model (step {step})"
            if now.checks_ok == 1
            else f"sync checks pass: every rank holds a bit-identical model ({now.checks_ok} so far, "
            f"the last at step {step})"
        )
        events.append(Event("Normal", "SyncVerified", message))
    found = int(new.get("mismatches", 0)) - int(old.get("mismatches", 0) or 0)
    if found > 0:
        if now.last_check_ok is False:
            diff = f", max |difference| {now.max_abs_diff:g}" if now.max_abs_diff is not None else ""
            message = (
                f"the sync check at step {step} found {now.mismatched_tensors} tensor(s) differing between "
                f"ranks{diff} (the final report names them)"
            )
        else:
            message = (
                f"{found} sync check(s) found ranks differing since the last reading; "
                f"the last check, at step {step}, passed"
            )
        events.append(Event("Warning", "SyncDivergence", message))
    if int(new.get("repairs", 0)) > int(old.get("repairs", 0) or 0):
        message = f"re-broadcast rank 0's model after a divergence ({new['repairs']} repair(s) so far)"
        events.append(Event("Normal", "SyncRepaired", message))
    return events


def completed_message(previous: Mapping[str, Any], attempt: int, now: dt.datetime, steps: int | None) -> str:
    """The Succeeded event: total time and throughput."""
    started = parse_time(previous.get("startTime"))
    took = f" in {duration((now - started).total_seconds())}" if started else ""
    progress = previous.get("progress") or {}
    rate = progress.get("samplesPerSecond")
    throughput = f", {rate:,.0f} samples/s" if isinstance(rate, (int, float)) else ""
    done = f": {steps} steps" if steps is not None else ""
    return f"attempt {attempt} completed{took}{done}{throughput}"


def final_progress(
    previous: Mapping[str, Any], step: int | None, total_steps: int, now: str
) -> dict[str, Any] | None:
    """``status.progress`` once the job has succeeded: the report's step, nothing left to wait for."""
    kept = previous.get("progress")
    if step is None:
        return dict(kept) if isinstance(kept, dict) else None
    percent = min(100, int(100 * step / total_steps)) if total_steps else 100
    out = {**(kept if isinstance(kept, dict) else {}), "step": step, "totalSteps": total_steps}
    out.update(percent=percent, summary=f"{percent}%", etaSeconds=0, eta="0s", computedAt=now)
    out.pop("etaTime", None)
    out.pop("unreachable", None)
    return out
