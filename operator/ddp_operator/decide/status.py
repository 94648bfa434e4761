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

from collections.abc import Mapping
from typing import Any

from ddp_operator.api import reasons, typed_status
from ddp_operator.api.spec import Spec
from ddp_operator.api.typed_status import Failure, LastReport
from ddp_operator.decide import checkpoints, compute_probe, sync_check
from ddp_operator.decide.status_builder import Said, StatusBuilder
from ddp_operator.decide.status_builder import finished as finished
from ddp_trainer import contract

PHASES = reasons.PHASES
TERMINAL = reasons.TERMINAL


# -- every branch -------------------------------------------------------------------------------------


def begin(
    out: StatusBuilder,
    generation: int,
    attempt: int,
    shown: int,
    report: contract.Report | None,
    spec: Spec,
    *more: Said,
) -> StatusBuilder:
    """The status fields every branch writes (``shown``: ``status.restarts``, and ``more``: what the rooms
    add, the restarts in place it does not count yet, :func:`~ddp_operator.decide.restarts.budget`), and the
    sync report when rank 0 has written one (``out``, the builder of the DDPJob's next status, returned)."""
    last, (preemptions, _) = out.last, out.counted
    every = Said(
        dict(
            attempt=attempt,
            # derived from the attempt and the restarts in place the pods reported, never counted apart
            restarts=shown,
            observed_generation=generation,
            start_time=last.start_time or out.now,
            ready_nodes=0,
        ),
        keep=(
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
        ),
    )
    kept: dict[str, Any] = dict(preemptions=preemptions) if preemptions else {}
    if report is None:  # status.sync goes on as stored
        out.say(every, Said(kept, go_on=("sync",), conditions=(checkpoints.durable(spec),)), *more)
        return out
    sync = dict(stored) if isinstance(stored := out.stored("sync"), dict) else None
    if sync is not None:
        kept = {**kept, **dict(sync=sync)}
    kept = {**kept, **_reported(report, attempt, sync or {}, out.stored("probe") or {})}
    out.say(every, Said(kept, conditions=(checkpoints.durable(spec),)), *more)
    return out


def _reported(
    report: contract.Report, attempt: int, sync: Mapping[str, Any], probe: Mapping[str, Any]
) -> dict[str, Any]:
    """What the status says of rank 0's report: ``status.sync`` (``sync``: as written before it),
    ``status.lastReport``, the checkpoint restored, the compute probe's finding (``probe``: as kept)."""
    # The report is the last word; what the live readings said beyond it (last check's time) stays.
    said = {**sync, **sync_check.from_report(report)}
    fields = dict(sync=sync_check.job_sync(said, report, attempt), last_report=last_report(report, attempt))
    if checkpoint := checkpoints.from_report(report):
        fields = {**fields, **dict(checkpoint=checkpoint)}
    if found := compute_probe.from_report(probe, report, attempt):
        fields = {**fields, **dict(probe=found)}
    return fields


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
