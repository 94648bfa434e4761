"""The DDPJob's status: its vocabulary (phases), its beginning and its end, and what the metrics reading
writes into it, through the one builder (:class:`~ddp_operator.decide.status_builder.StatusBuilder`). Pure.

- every branch: :func:`begin` (attempt, restarts, start time, what the previous status keeps,
  ``status.lastReport``, and what the rooms say of rank 0's report: :mod:`~ddp_operator.decide.sync_check`,
  :mod:`~ddp_operator.decide.checkpoints`, :mod:`~ddp_operator.decide.compute_probe`);
- a running attempt: :func:`write_reading`: the latest metrics reading (:mod:`ddp_operator.observe.live`) as
  ``status.progress``, the live ``status.sync`` and its events, ``MetricsScraped``, at most every
  :data:`STATUS_SECONDS` per job, so a reconcile with nothing else new writes nothing;
- an end: :func:`finish` (phase, ``completionTime``, ``Complete`` or ``Failed``, ``SyncVerified``),
  :func:`final_progress` and :func:`completed_message`.

:mod:`ddp_operator.decide.decision` decides which branch applies and says its phase and ``Ready``
condition. Sections are written through :class:`~ddp_operator.decide.status_builder.Section` by field
name, their keys in the order first written: the status written stays the same JSON.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from ddp_operator.api import reasons, typed_status
from ddp_operator.api.spec import Spec
from ddp_operator.api.typed_status import Failure, LastReport, Status
from ddp_operator.decide import checkpoints, compute_probe, restarts, sync_check
from ddp_operator.decide.status_builder import Section, StatusBuilder, count, parse_time, stamp
from ddp_operator.decide.status_builder import finished as finished
from ddp_operator.observe.live import Snapshot, rates
from ddp_operator.observe.metrics import duration, slowest
from ddp_trainer import contract

PHASES = reasons.PHASES
TERMINAL = reasons.TERMINAL
METRICS_SCRAPED = reasons.METRICS_SCRAPED
"""The condition that says whether the pods' metrics could be read."""
STATUS_SECONDS = 10.0
"""At most one change of ``status.progress`` per job in this time."""


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
        sync = {**(out.stored("sync", written=True) or {}), **sync_check.from_report(report)}
        out.set(sync=sync_check.job_sync(sync, report, attempt), last_report=last_report(report, attempt))
        if checkpoint := checkpoints.from_report(report):
            out.set(checkpoint=checkpoint)
        if probe := compute_probe.from_report(out.stored("probe", written=True) or {}, report, attempt):
            out.set(probe=probe)
    checkpoints.durable_condition(out, spec)
    return out


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
    sync_check.condition(out)


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
        new_sync = sync_check.live_sync(old_sync, snapshot.latest, attempt)
        if new_sync:
            out.set(sync=new_sync)
        out.events.extend(sync_check.events(old_sync, new_sync, snapshot.latest))


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
