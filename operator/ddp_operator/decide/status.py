"""The DDPJob's status: its vocabulary (phases), its beginning and its end, through the one builder
(:class:`~ddp_operator.decide.status_builder.StatusBuilder`). Pure.

- every branch: :func:`begin` (attempt, restarts, start time, what the previous status keeps,
  ``status.lastReport``, and what the rooms say of rank 0's report: :mod:`~ddp_operator.decide.sync_check`,
  :mod:`~ddp_operator.decide.checkpoints`, :mod:`~ddp_operator.decide.compute_probe`);
- an end: :func:`finish` (phase, ``completionTime``, ``Complete`` or ``Failed``, ``SyncVerified``), and
  :func:`keep_finished` (a terminal phase sticks).

:mod:`ddp_operator.decide.decision` decides which branch applies and says its phase and ``Ready``
condition; the rooms under ``decide/`` say the rest (a running attempt's progress:
:mod:`~ddp_operator.decide.progress`). Sections are written through
:class:`~ddp_operator.decide.status_builder.Section` by field name, their keys in the order first
written: the status written stays the same JSON.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from ddp_operator.api import reasons, typed_status
from ddp_operator.api.spec import Spec
from ddp_operator.api.typed_status import Failure, LastReport
from ddp_operator.decide import checkpoints, compute_probe, restarts, sync_check
from ddp_operator.decide.status_builder import StatusBuilder, count, stamp
from ddp_operator.decide.status_builder import finished as finished
from ddp_trainer import contract

PHASES = reasons.PHASES
TERMINAL = reasons.TERMINAL


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
