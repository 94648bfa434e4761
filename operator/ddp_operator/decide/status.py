"""The DDPJob's status, in one place: its vocabulary (phases), and what each source writes into it through
the one builder (:class:`~ddp_operator.decide.status_builder.StatusBuilder`), reading the status before typed
(:mod:`ddp_operator.api.typed_status`). Pure.

- every branch: :func:`begin` (attempt, restarts, start time, what the previous status keeps, rank 0's
  report as ``status.sync`` and ``status.lastReport``, and what :mod:`ddp_operator.decide.checkpoints` says:
  ``status.checkpoint``, the ``CheckpointsDurable`` condition);
- a running attempt: :func:`write_reading` turns the latest metrics reading (:mod:`ddp_operator.observe.live`)
  into ``status.progress``, the live part of ``status.sync``, the ``MetricsScraped`` condition and the
  events a person wants (first good sync check, a divergence, a repair), at most every
  :data:`STATUS_SECONDS` per job, so a reconcile with nothing else new writes nothing;
- an end: :func:`finish` (phase, ``completionTime``, ``Complete`` or ``Failed``), :func:`final_progress`
  and :func:`completed_message`; and the ``SyncVerified`` condition (:func:`sync_condition`).

:mod:`ddp_operator.decide.decision` decides which branch applies and says its phase and ``Ready`` condition
through the builder; :mod:`ddp_operator.runtime.reconcile` writes the result.

Long because the whole status (its fields, conditions and events, from the report, the readings and the
spec) reads best in one place, each piece a small pure function. The sections (``progress``, ``sync``,
``probe``) are written through :class:`~ddp_operator.decide.status_builder.Section` by field name, their
keys in the order first written (which the typed status's fixed order would not keep): the status written
stays the same JSON.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from ddp_operator.api import reasons, typed_status
from ddp_operator.api.spec import Spec
from ddp_operator.api.typed_status import Failure, LastReport, LastRestart, Status, Sync
from ddp_operator.decide import checkpoints, compute_probe, restarts
from ddp_operator.decide.plan import Event
from ddp_operator.decide.status_builder import Section, StatusBuilder
from ddp_operator.decide.status_builder import finished as finished
from ddp_operator.observe.live import Snapshot, rates
from ddp_operator.observe.progress import (
    Progress,
    attempt_checks,
    duration,
    job_checks,
    slowest,
    with_attempt,
)
from ddp_trainer import contract

PHASES = reasons.PHASES
TERMINAL = reasons.TERMINAL
METRICS_SCRAPED = reasons.METRICS_SCRAPED
"""The condition that says whether the pods' metrics could be read."""
STATUS_SECONDS = 10.0
"""At most one change of ``status.progress`` per job in this time."""


def stamp(moment: dt.datetime) -> str:
    """RFC 3339 in UTC, as the API server writes times."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def count(value: Any) -> int:
    """A count from the status: a non-negative integer (anything else, hand-written, counts as 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# -- every branch -------------------------------------------------------------------------------------


def begin(
    previous: Mapping[str, Any],
    now: dt.datetime,
    generation: int,
    attempt: int,
    report: contract.Report | None,
    spec: Spec,
) -> StatusBuilder:
    """The status fields every branch writes, and the sync report when rank 0 has written one."""
    out = StatusBuilder(previous, stamp(now))
    last = out.last
    out.set(
        attempt=attempt,
        # derived from the attempt and the restarts in place the pods reported, never counted apart
        restarts=restarts.shown(attempt, count(last.restarts_in_place)),
        observed_generation=generation,
        start_time=last.start_time or out.now,
        ready_nodes=0,
    )
    out.keep(
        "completion_time",
        "last_report",
        "progress",
        "checkpoint",
        "probe",
        "kueue",
        "elastic",  # an elastic job's size and resizes (decide.resize), kept once the Job has finished
        "selector",
        "restarts_in_place",
        "last_restart",
    )
    if preemptions := count(last.preemptions):
        out.set(preemptions=preemptions)
    if isinstance(sync := out.stored("sync"), dict):
        out.set(sync=dict(sync))
    if report is not None:
        # The report is the last word; what the live readings said beyond it (last check's time) stays.
        sync = {**(out.stored("sync", written=True) or {}), **report_sync(report)}
        out.set(sync=job_sync(sync, report, attempt), last_report=last_report(report, attempt))
        if checkpoint := checkpoints.from_report(report):
            out.set(checkpoint=checkpoint)
        if probe := compute_probe.from_report(out.stored("probe", written=True) or {}, report, attempt):
            out.set(probe=probe)
    checkpoints.durable_condition(out, spec)
    return out


# -- gang restarts ------------------------------------------------------------------------------------

RESTARTS_IN_PLACE_FIELD = typed_status.key(Status, "restarts_in_place")
"""``status.restartsInPlace``: the job's gang restarts done in place, over all its attempts (each attempt's
count is its pods' report, :data:`ddp_trainer.contract.REPORT_RESTARTS_IN_PLACE`, or their metric); the
operator's metrics read it (``runtime/opmetrics``)."""
IN_PLACE, RECREATE = "InPlace", "Recreate"
RESTARTED_IN_PLACE = reasons.RESTARTED_IN_PLACE
"""The reason (and the event's) of a gang restart done in place."""
LAST_RESTART_FIELD = typed_status.key(Status, "last_restart")
"""``status.lastRestart``: the last gang restart, in place or by a new Job."""


def in_place_so_far(previous: Status, attempt: int) -> int:
    """The restarts in place of ``attempt`` the status already counts."""
    last = previous.last_restart
    if last is not None and last.kind == IN_PLACE and last.attempt == attempt:
        return count(last.in_attempt)
    return 0


def restarted_in_place(out: StatusBuilder, attempt: int, seen: int, cause: str, max_restarts: int) -> None:
    """Count the restarts in place the pods of ``attempt`` reported (``seen`` so far in the attempt; the
    cause of the last) beyond what the status counts: ``restarts``, ``restartsInPlace``, ``lastRestart``
    and a Warning event."""
    known = in_place_so_far(out.last, attempt)
    if seen <= known:
        return
    now = out.current()
    total = count(now.restarts) + seen - known
    out.set(restarts_in_place=count(now.restarts_in_place) + seen - known, restarts=total)
    why = cause or "a process failed"
    message = (
        f"attempt {attempt}: gang restarted in place ({seen} in this attempt, {total} of "
        f"maxRestarts {max_restarts} used): {why}; same pods, resuming from the last checkpoint"
    )
    out.set(last_restart=LastRestart(IN_PLACE, attempt, seen, RESTARTED_IN_PLACE, message[:1024], out.now))
    out.events.append(Event("Warning", RESTARTED_IN_PLACE, message))


def recreated(out: StatusBuilder, attempt: int, reason: str, message: str) -> None:
    """The gang restarts as ``attempt`` (a new Job and new pods)."""
    out.set(last_restart=LastRestart(RECREATE, attempt, None, reason, message[:1024], out.now))


def report_sync(report: contract.Report) -> dict[str, Any]:
    """The part of a report that becomes ``status.sync``."""
    return {key: report[key] for key in contract.SYNC_STATUS_KEYS if key in report}


SYNC_ATTEMPTS_FIELD = typed_status.key(typed_status.Sync, "attempts")
"""``status.sync.attempts``: each attempt's checks (:func:`ddp_operator.observe.progress.attempt_checks`),
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


def _earlier_attempts(sync: Mapping[str, Any], attempt: int) -> dict[str, int]:
    """The checks, mismatches and repairs of the attempts before ``attempt``."""
    kept = typed_status.read_as(Sync, sync).attempts or ()
    return job_checks([typed_status.write(a) for a in kept if count(a.attempt) < attempt])


LAST_FAILURES = 16
"""Failed ranks ``status.lastReport.failures`` keeps (the earliest first)."""


def last_report(report: contract.Report, attempt: int) -> dict[str, Any]:
    """What ``status.lastReport`` keeps of a report: enough to decide after the pod is gone."""
    entries = [f for f in report.get("failures") or [] if isinstance(f, Mapping)][:LAST_FAILURES]
    kept = LastReport(
        attempt,
        report.get("result"),
        report.get("reason"),
        str(report.get("message", ""))[:1024],
        # who failed first must survive the pods' deletion (failures.describe reads them back)
        tuple(_failure(f) for f in entries) or None,
    )
    return typed_status.write(kept)


def _failure(failure: contract.Failure) -> Failure:
    rank, at, restart = failure.get("rank"), failure.get("at"), failure.get("restart")
    return Failure(
        int(rank) if isinstance(rank, int | float) else None,
        float(at) if isinstance(at, int | float) else None,
        int(restart) if isinstance(restart, int | float) else None,
        str(failure.get("error", ""))[:512],
    )


# -- an end -------------------------------------------------------------------------------------------


def keep_finished(out: StatusBuilder) -> None:
    """A terminal phase sticks, and the conditions written with it."""
    out.set(phase=out.last.phase)
    out.keep_conditions()


def finish(out: StatusBuilder, succeeded: bool, reason: str, message: str) -> None:
    """The terminal phase, its completionTime and its Complete or Failed condition."""
    phase = "Succeeded" if succeeded else "Failed"
    out.set(completion_time=out.stored("completion_time", written=True) or out.now)
    out.phase(phase, reason, message, warning=not succeeded)
    out.condition(reasons.READY, False, reason, message)
    out.condition("Complete" if succeeded else "Failed", True, reason, message)
    sync_condition(out)


def sync_condition(out: StatusBuilder) -> None:
    now = out.current()
    sync, last = now.sync, now.last_report or LastReport()
    said = str(last.message or "")
    if sync is None or sync == Sync():  # no check written
        if last.reason in contract.NOTHING_TO_COMPARE:
            out.condition(reasons.SYNC_VERIFIED, None, str(last.reason), said)
        elif last.reason == contract.SYNC_HOOK_OFF:
            out.condition(reasons.SYNC_VERIFIED, None, contract.SYNC_HOOK_OFF, said)
        else:
            message = "no sync check reported yet (read from the pods' metrics, and rank 0's final report)"
            out.condition(reasons.SYNC_VERIFIED, None, "NotYetReported", message)
        return
    checks, mismatches = sync.checks or 0, sync.mismatches or 0
    if sync.verified:
        attempts = len(sync.attempts or ())
        over = f" over {attempts} attempts" if attempts > 1 else ""
        out.condition(
            reasons.SYNC_VERIFIED,
            True,
            "BitIdentical",
            f"{mismatches} of {checks} checks found ranks differing; {sync.repairs} repair(s) re-broadcast "
            "rank 0's model and the last check found every rank bit-identical"
            if sync.repairs
            else f"{checks} checks{over} found every rank bit-identical",
        )
    else:
        out.condition(
            reasons.SYNC_VERIFIED, False, "Diverged", f"{mismatches} of {checks} checks found ranks differing"
        )


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


# -- a running attempt's readings ---------------------------------------------------------------------


def write_reading(out: StatusBuilder, snapshot: Snapshot | None, attempt: int, total_steps: int) -> None:
    """Write a fresh reading into the status, at most every :data:`STATUS_SECONDS`; keep the last one
    otherwise. Posts the events of what changed since."""
    if isinstance(kept := out.stored("progress"), dict):
        out.set(progress=dict(kept))
    out.keep_conditions(METRICS_SCRAPED)
    if snapshot is None or snapshot.attempt != attempt:
        return
    progress = out.last.progress
    written = parse_time(progress.computed_at) if progress is not None else None
    if written is not None and snapshot.at - written.timestamp() < STATUS_SECONDS:
        return
    out.set(progress=progress_status(snapshot, total_steps))
    _scraped_condition(out, snapshot)
    if snapshot.latest is not None:
        old_sync = out.stored("sync", written=True) or {}
        new_sync = live_sync(old_sync, snapshot.latest, attempt)
        if new_sync:
            out.set(sync=new_sync)
        out.events.extend(_sync_events(old_sync, new_sync, snapshot.latest))


def progress_status(snapshot: Snapshot, total_steps: int) -> dict[str, Any]:
    """``status.progress`` from a snapshot (only the fields the metrics tell)."""
    out = Section(typed_status.Progress)
    out.set(computed_at=stamp(dt.datetime.fromtimestamp(snapshot.at, dt.UTC)))
    if snapshot.refused or snapshot.unreachable:
        pods = [*snapshot.refused, *(u.split(":")[0] for u in snapshot.unreachable)]
        out.set(unreachable=sorted(pods)[:64])
    now = snapshot.latest
    if now is None:
        return out.values
    total_steps = now.total_steps or total_steps  # the code's own total where it says (a Trainer's max_steps)
    if total_steps:
        percent = min(100, int(100 * now.step / total_steps))
        out.set(step=now.step, total_steps=total_steps, percent=percent, summary=f"{percent}%")
    else:  # nobody says how many steps there will be: the step, the rates, no percent or ETA
        out.set(step=now.step, summary=f"step {now.step}")
    steps_per_s, samples_per_s = rates(snapshot)
    if samples_per_s is not None:
        out.set(samples_per_second=round(samples_per_s, 1))
    if steps_per_s:
        out.set(steps_per_second=round(steps_per_s, 3))
    if steps_per_s and total_steps:
        eta = max(0, total_steps - now.step) / steps_per_s
        out.set(
            eta_seconds=round(eta),
            eta=duration(eta),
            eta_time=stamp(dt.datetime.fromtimestamp(snapshot.at + eta, dt.UTC)),
        )
    if now.loss is not None:
        out.set(loss=now.loss)
    if now.nonfinite_steps:
        out.set(nonfinite_loss_steps=now.nonfinite_steps)
    if (found := slowest(now, snapshot.earlier)) is not None:
        out.set(slowest_rank=found[0], slowest_step_seconds=round(found[1], 6))
    if now.skew is not None:
        out.set(step_time_skew=round(now.skew, 4))
    return out.values


def live_sync(previous: Mapping[str, Any], now: Progress, attempt: int = 0) -> dict[str, Any]:
    """``status.sync`` while the job runs: the live count of checks (the running world's, after the earlier
    attempts' of ``status.sync.attempts``), the last one's step, time and verdict."""
    checks = now.checks_ok + now.checks_mismatch
    out = Section(Sync, dict(previous))
    if not checks:
        return out.values
    earlier = _earlier_attempts(previous, attempt)
    mismatches, repairs = now.checks_mismatch + earlier["mismatches"], now.repairs + earlier["repairs"]
    out.set(checks=checks + earlier["checks"], mismatches=mismatches, repairs=repairs)
    if now.last_check_ok is not None:
        out.set(
            last_check_result="BitIdentical" if now.last_check_ok else "Diverged",
            verified=now.last_check_ok and mismatches <= repairs,
        )
    if now.last_check_time is not None:
        out.set(last_check_time=stamp(dt.datetime.fromtimestamp(now.last_check_time, dt.UTC)))
    if now.last_check_step is not None:
        out.set(last_check_step=now.last_check_step)
    return out.values


def _scraped_condition(out: StatusBuilder, snapshot: Snapshot) -> None:
    port, asked = snapshot.port, snapshot.pods
    answered = asked - len(snapshot.refused) - len(snapshot.unreachable)
    if answered and answered == asked:
        out.condition(
            METRICS_SCRAPED, True, "Scraped", f"read the metrics of {answered}/{asked} pods on port {port}"
        )
    elif answered:
        missing = ", ".join([*snapshot.refused, *snapshot.unreachable])
        out.condition(
            METRICS_SCRAPED, True, "PartlyUnreachable", f"{answered}/{asked} pods answered; not: {missing}"
        )
    elif snapshot.unreachable:
        why = "; ".join(snapshot.unreachable)
        message = (
            f"no pod answered on port {port} ({why}): no progress to show; a NetworkPolicy must let the "
            "operator reach the pods on this port (docs/operator.md)"
        )
        out.condition(METRICS_SCRAPED, False, "Unreachable", message)
    else:
        message = (
            f"nothing listens on port {port} in the pods (yet): the command exports no metrics, so there "
            "is no progress to show"
        )
        out.condition(METRICS_SCRAPED, False, "NoMetrics", message)


def _sync_events(old: Mapping[str, Any], new: Mapping[str, Any], now: Progress) -> list[Event]:
    """What changed since the last written reading (the gauges describe the last check only)."""
    events = []
    before, after = typed_status.read_as(Sync, old), typed_status.read_as(Sync, new)
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
