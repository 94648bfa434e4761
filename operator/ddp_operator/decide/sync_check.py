"""The sync check, one room of the decision: what the status says of it. Pure.

The trainer checks at intervals that every rank holds a bit-identical model (``ddp_trainer.sync``): its
pods' metrics count the checks while the job runs, rank 0's report tells them at the end. Here:

- :func:`from_report` and :func:`job_sync`: ``status.sync`` after a report, each attempt's checks kept in
  ``status.sync.attempts`` and summed over the whole job;
- :func:`live` (:func:`live_sync` and :func:`events`): ``status.sync`` from a running attempt's
  metrics reading, and the events of what changed since the last one written (the first good check, a
  divergence, a repair);
- :func:`condition`: the ``SyncVerified`` condition, from what ``status.sync`` and ``status.lastReport``
  say.

:mod:`ddp_operator.decide.status` writes ``status.sync`` from the report
(:func:`~ddp_operator.decide.status.begin`), :mod:`ddp_operator.decide.progress` from the metrics reading
(:func:`~ddp_operator.decide.progress.write_reading`); the condition is said wherever a branch ends its
status.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from ddp_operator.api import reasons, typed_status
from ddp_operator.api.typed_status import LastReport, Status, Sync
from ddp_operator.decide.plan import Event
from ddp_operator.decide.status_builder import Parts, Said, Section, StatusBuilder, count
from ddp_operator.observe.metrics import Progress
from ddp_operator.observe.sync_report import attempt_checks, job_checks, with_attempt
from ddp_trainer import contract


def from_report(report: contract.Report) -> dict[str, Any]:
    """The part of a report that becomes ``status.sync``."""
    return {key: report[key] for key in contract.SYNC_STATUS_KEYS if key in report}


SYNC_ATTEMPTS_FIELD = typed_status.key(typed_status.Sync, "attempts")
"""``status.sync.attempts``: each attempt's checks (:func:`ddp_operator.observe.sync_report.attempt_checks`),
of which ``status.sync``'s checks, mismatches and repairs are the sum: the whole job, every attempt and
world."""


def job_sync(sync: Mapping[str, Any], report: contract.Report, attempt: int) -> dict[str, Any]:
    """``status.sync`` with ``attempt``'s checks as its ``report`` tells them (its earlier worlds' too)
    in ``attempts``, and the counts over every attempt: a new attempt's report no longer replaces the
    earlier attempts' checks. Verified: the report's verdict, with every mismatch of the job repaired."""
    out = Section(Sync, dict(sync))
    attempts = with_attempt(out.stored("attempts"), attempt_checks(report, attempt))
    if not attempts:
        return out.values
    totals = job_checks(attempts)
    out.set(checks=totals["checks"], mismatches=totals["mismatches"], repairs=totals["repairs"])
    out.set(attempts=attempts)
    if out.has("verified"):
        out.set(verified=bool(out.stored("verified")) and totals["mismatches"] <= totals["repairs"])
    return out.values


def _earlier_attempts(sync: Sync, attempt: int) -> dict[str, int]:
    """The checks, mismatches and repairs of the attempts before ``attempt``, summed as
    :func:`~ddp_operator.observe.sync_report.job_checks` sums them, from ``sync`` typed."""
    earlier = [a for a in sync.attempts or () if count(a.attempt) < attempt]
    return dict(
        checks=sum(count(a.checks) for a in earlier),
        mismatches=sum(count(a.mismatches) for a in earlier),
        repairs=sum(count(a.repairs) for a in earlier),
    )


def condition(out: StatusBuilder) -> None:
    """``SyncVerified`` (:func:`verified`) of the status written so far."""
    out.say(Said(conditions=(verified(out.current()),)))


def verified(now: Status) -> tuple[str, bool | None, str, str]:
    """``SyncVerified`` of status ``now``: every rank bit-identical (repairs said), ranks that diverged, or
    why nothing was compared yet."""
    sync, last = now.sync, now.last_report or LastReport()
    said = str(last.message or "")
    if sync is None or sync == Sync():  # no check written
        if last.reason in contract.NOTHING_TO_COMPARE:
            return reasons.SYNC_VERIFIED, None, str(last.reason), said
        if last.reason == contract.SYNC_HOOK_OFF:
            return reasons.SYNC_VERIFIED, None, contract.SYNC_HOOK_OFF, said
        message = "no sync check reported yet (read from the pods' metrics, and rank 0's final report)"
        return reasons.SYNC_VERIFIED, None, "NotYetReported", message
    checks, mismatches = sync.checks or 0, sync.mismatches or 0
    if not sync.verified:
        return (
            reasons.SYNC_VERIFIED,
            False,
            "Diverged",
            f"{mismatches} of {checks} checks found ranks differing",
        )
    attempts = len(sync.attempts or ())
    over = f" over {attempts} attempts" if attempts > 1 else ""
    message = (
        f"{mismatches} of {checks} checks found ranks differing; {sync.repairs} repair(s) re-broadcast "
        "rank 0's model and the last check found every rank bit-identical"
        if sync.repairs
        else f"{checks} checks{over} found every rank bit-identical"
    )
    return reasons.SYNC_VERIFIED, True, "BitIdentical", message


def live(old_sync: Mapping[str, Any], now: Progress, attempt: int) -> Said:
    """``status.sync`` from a running attempt's reading (:func:`live_sync`, said as its parts for the builder
    to write; ``old_sync``: as written so far), when it says anything, and the events of what changed since
    the last one written (:func:`events`). ``old_sync`` is read typed once, for both; what the reading
    changed is known as it is said (:func:`_counted`), where the section written was read back typed."""
    before = typed_status.read_as(Sync, old_sync)
    parts, after = _counted(now, attempt, before)
    new_sync = Parts(Sync, parts, stored=old_sync) if parts else dict(old_sync)
    return Said(dict(sync=new_sync) if new_sync else {}, events=tuple(events(before, after, now)))


def live_sync(
    previous: Mapping[str, Any], now: Progress, attempt: int = 0, typed: Sync | None = None
) -> dict[str, Any]:
    """``status.sync`` while the job runs: the live count of checks (the running world's, after the earlier
    attempts' of ``status.sync.attempts``), the last one's step, time and verdict (``typed``: ``previous``
    read typed, where the caller has it)."""
    parts, _ = _counted(now, attempt, typed if typed is not None else typed_status.read_as(Sync, previous))
    return Section.of(Sync, *parts, stored=previous) if parts else dict(previous)


def _counted(now: Progress, attempt: int, typed: Sync) -> tuple[tuple[dict[str, Any], ...], Sync]:
    """:func:`live_sync`'s parts, in order (none when the reading counts no check), after ``typed``
    (``status.sync`` written so far, typed), and the counts they write and the last check's step, typed (as
    :func:`events` reads them; ``typed`` itself when the reading counts no check)."""
    checks = now.checks_ok + now.checks_mismatch
    if not checks:
        return (), typed
    earlier = _earlier_attempts(typed, attempt)
    mismatches, repairs = now.checks_mismatch + earlier["mismatches"], now.repairs + earlier["repairs"]
    parts: list[dict[str, Any]] = [
        dict(checks=checks + earlier["checks"], mismatches=mismatches, repairs=repairs)
    ]
    if now.last_check_ok is not None:
        parts.append(
            dict(
                last_check_result="BitIdentical" if now.last_check_ok else "Diverged",
                verified=now.last_check_ok and mismatches <= repairs,
            )
        )
    if now.last_check_time is not None:
        parts.append(dict(last_check_time=dt.datetime.fromtimestamp(now.last_check_time, dt.UTC)))
    step = typed.last_check_step
    if now.last_check_step is not None:
        step = now.last_check_step
        parts.append(dict(last_check_step=step))
    counted = Sync(
        checks=checks + earlier["checks"], mismatches=mismatches, repairs=repairs, last_check_step=step
    )
    return tuple(parts), counted


def events(before: Sync, after: Sync, now: Progress) -> list[Event]:
    """What changed since the last written reading (``before``: ``status.sync`` typed; ``after``: its counts
    and last check's step once the reading is written; the gauges describe the last check only)."""
    events = []
    step = after.last_check_step if after.last_check_step is not None else now.step
    if not before.checks and now.checks_ok and now.last_check_ok:
        message = (
            f"first sync check passed: every rank holds a bit-identical model (step {step})"
            if now.checks_ok == 1
            else f"sync checks pass: every rank holds a bit-identical model ({now.checks_ok} so far, "
            f"the last at step {step})"
        )
        events.append(Event("Normal", reasons.SYNC_VERIFIED, message))
    found = (after.mismatches or 0) - (before.mismatches or 0)
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
        events.append(Event("Warning", reasons.SYNC_DIVERGENCE, message))
    if (after.repairs or 0) > (before.repairs or 0):
        message = f"re-broadcast rank 0's model after a divergence ({after.repairs} repair(s) so far)"
        events.append(Event("Normal", "SyncRepaired", message))
    return events
