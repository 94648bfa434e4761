"""The DDPJob's status, in one place: its vocabulary (phases), the builder that assembles it with stable
condition transition times, and what each source writes into it. Pure.

- every branch: :func:`begin` (attempt, restarts, start time, what the previous status keeps, rank 0's
  report as ``status.sync``, ``status.lastReport`` and ``status.checkpoint``, the ``CheckpointsDurable``
  condition);
- a running attempt: :func:`write_reading` turns the latest metrics reading (:mod:`ddp_operator.observe.live`)
  into ``status.progress``, the live part of ``status.sync``, the ``MetricsScraped`` condition and the
  events a person wants (first good sync check, a divergence, a repair), at most every
  :data:`STATUS_SECONDS` per job, so a reconcile with nothing else new writes nothing;
- an end: :func:`finish` (phase, ``completionTime``, ``Complete`` or ``Failed``), :func:`final_progress`
  and :func:`completed_message`; and the ``SyncVerified`` condition (:func:`sync_condition`).

:mod:`ddp_operator.decide.decision` decides which branch applies and says its phase and ``Ready`` condition
through the builder; :mod:`ddp_operator.runtime.reconcile` writes the result.

Long because the whole status (its fields, conditions and events, from the report, the readings and the
spec) reads best in one place, each piece a small pure function.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_operator.api import reasons
from ddp_operator.api.spec import Spec, checkpoints_durable
from ddp_operator.decide import restarts
from ddp_operator.decide.plan import Event, Obj, Plan
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


@dataclass
class StatusBuilder:
    """The status under construction, with the conditions and events that go with it."""

    previous: Mapping[str, Any]
    now: str
    values: Obj = field(default_factory=dict)
    conditions: dict[str, Obj] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    def condition(self, kind: str, status: bool | None, reason: str, message: str) -> None:
        value = "Unknown" if status is None else str(status)
        old = {c.get("type"): c for c in self.previous.get("conditions", []) or []}.get(kind, {})
        since = old.get("lastTransitionTime") if old.get("status") == value else self.now
        self.conditions[kind] = {
            "type": kind,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since or self.now,
        }

    def phase(self, phase: str, reason: str, message: str, warning: bool = False) -> None:
        self.values["phase"] = phase
        ready = {c.get("type"): c for c in self.previous.get("conditions", []) or []}.get(reasons.READY, {})
        if self.previous.get("phase") != phase or ready.get("reason") != reason:
            self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def plan(self, **steps: Any) -> Plan:
        status = {**self.values, "conditions": [self.conditions[k] for k in sorted(self.conditions)]}
        return Plan(status, events=tuple(self.events), **steps)


def finished(status: Mapping[str, Any]) -> bool:
    """A terminal phase, with what this operator writes along with one: a completionTime and a True
    Complete or Failed condition. A phase without them (a hand-edited status) is not believed: the next
    decision repairs it from the children."""
    conditions = status.get("conditions")
    said = [
        c
        for c in (conditions if isinstance(conditions, list) else [])
        if isinstance(c, Mapping) and c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
    ]
    return status.get("phase") in TERMINAL and bool(status.get("completionTime")) and bool(said)


def count(value: Any) -> int:
    """A count from the status: a non-negative integer (anything else, hand-written, counts as 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# -- every branch -------------------------------------------------------------------------------------


def begin(
    previous: Mapping[str, Any],
    now: dt.datetime,
    generation: int,
    attempt: int,
    report: Mapping[str, Any] | None,
    spec: Spec,
) -> StatusBuilder:
    """The status fields every branch writes, and the sync report when rank 0 has written one."""
    out = StatusBuilder(previous, stamp(now))
    out.values.update(
        attempt=attempt,
        # derived from the attempt and the restarts in place the pods reported, never counted apart
        restarts=restarts.shown(attempt, count(previous.get(RESTARTS_IN_PLACE_FIELD))),
        observedGeneration=generation,
        startTime=previous.get("startTime") or out.now,
        readyNodes=0,
    )
    for kept in (
        "completionTime",
        "lastReport",
        "progress",
        "checkpoint",
        "probe",
        "kueue",
        "elastic",  # an elastic job's size and resizes (decide.resize), kept once the Job has finished
        "selector",
        RESTARTS_IN_PLACE_FIELD,
        LAST_RESTART_FIELD,
    ):
        if previous.get(kept):
            out.values[kept] = previous[kept]
    if preemptions := count(previous.get("preemptions")):
        out.values["preemptions"] = preemptions
    if isinstance(previous.get("sync"), dict):
        out.values["sync"] = dict(previous["sync"])
    if report is not None:
        # The report is the last word; what the live readings said beyond it (last check's time) stays.
        out.values["sync"] = job_sync({**out.values.get("sync", {}), **report_sync(report)}, report, attempt)
        out.values["lastReport"] = last_report(report, attempt)
        if checkpoint := report_checkpoint(report):
            out.values["checkpoint"] = checkpoint
        if probe := report_probe(out.values.get("probe") or {}, report, attempt):
            out.values["probe"] = probe
    durable_condition(out, spec)
    return out


# -- gang restarts ------------------------------------------------------------------------------------

RESTARTS_IN_PLACE_FIELD = "restartsInPlace"
"""``status.restartsInPlace``: the job's gang restarts done in place, over all its attempts (each attempt's
count is its pods' report, :data:`ddp_trainer.contract.REPORT_RESTARTS_IN_PLACE`, or their metric)."""
LAST_RESTART_FIELD = "lastRestart"
"""``status.lastRestart``: the last gang restart, in place or by a new Job (its kind, attempt, reason and
message)."""
IN_PLACE, RECREATE = "InPlace", "Recreate"
RESTARTED_IN_PLACE = reasons.RESTARTED_IN_PLACE
"""The reason (and the event's) of a gang restart done in place."""


def in_place_so_far(previous: Mapping[str, Any], attempt: int) -> int:
    """The restarts in place of ``attempt`` the status already counts."""
    last = previous.get(LAST_RESTART_FIELD)
    if isinstance(last, Mapping) and last.get("kind") == IN_PLACE and last.get("attempt") == attempt:
        return count(last.get("inAttempt"))
    return 0


def restarted_in_place(out: StatusBuilder, attempt: int, seen: int, cause: str, max_restarts: int) -> None:
    """Count the restarts in place the pods of ``attempt`` reported (``seen`` so far in the attempt; the
    cause of the last) beyond what the status counts: ``restarts``, ``restartsInPlace``, ``lastRestart``
    and a Warning event."""
    known = in_place_so_far(out.previous, attempt)
    if seen <= known:
        return
    total = count(out.values.get(RESTARTS_IN_PLACE_FIELD)) + seen - known
    out.values[RESTARTS_IN_PLACE_FIELD] = total
    out.values["restarts"] = count(out.values.get("restarts")) + seen - known
    why = cause or "a process failed"
    message = (
        f"attempt {attempt}: gang restarted in place ({seen} in this attempt, {out.values['restarts']} of "
        f"maxRestarts {max_restarts} used): {why}; same pods, resuming from the last checkpoint"
    )
    out.values[LAST_RESTART_FIELD] = {
        "kind": IN_PLACE,
        "attempt": attempt,
        "inAttempt": seen,
        "reason": RESTARTED_IN_PLACE,
        "message": message[:1024],
        "time": out.now,
    }
    out.events.append(Event("Warning", RESTARTED_IN_PLACE, message))


def recreated(out: StatusBuilder, attempt: int, reason: str, message: str) -> None:
    """The gang restarts as ``attempt`` (a new Job and new pods)."""
    out.values[LAST_RESTART_FIELD] = {
        "kind": RECREATE,
        "attempt": attempt,
        "reason": reason,
        "message": message[:1024],
        "time": out.now,
    }


def probe_finding(previous: Mapping[str, Any], report: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """``status.probe`` after a report that names faulty ranks: the finding (ranks, message, attempt);
    ``faultyNodes`` (the nodes later attempts avoid) is kept as it was (:func:`avoid_nodes` adds to it)."""
    out = dict(previous)
    out.update(
        faultyRanks=[r for r in report.get("faultyRanks") or [] if isinstance(r, int)][:16],
        attempt=attempt,
        message=str(report.get("message", ""))[:1024],
    )
    return out


def report_probe(previous: Mapping[str, Any], report: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """``status.probe`` after a report: a finding that names faulty ranks (:func:`probe_finding`), and the
    last probe's verdict and why (undecidable, say: the model does not reproduce itself); {} if neither."""
    out = probe_finding(previous, report, attempt) if report.get("faultyRanks") else dict(previous)
    if report.get("probeVerdict") in contract.PROBE_RESULTS:
        out.update(lastVerdict=report["probeVerdict"], lastWhy=str(report.get("probeWhy", ""))[:1024])
    return out


def avoided_nodes(status: Mapping[str, Any]) -> tuple[str, ...]:
    """``status.probe.faultyNodes``: where the compute probe found a faulty rank under ``Fail``."""
    probe = status.get("probe")
    nodes = probe.get("faultyNodes") if isinstance(probe, Mapping) else None
    return tuple(n for n in nodes if isinstance(n, str) and n) if isinstance(nodes, list) else ()


def avoid_nodes(out: StatusBuilder, nodes: tuple[str, ...]) -> None:
    """Add ``nodes`` to ``status.probe.faultyNodes``: the next attempts' pods stay off them."""
    probe = dict(out.values.get("probe") or {})
    probe["faultyNodes"] = list(dict.fromkeys([*avoided_nodes(out.values), *nodes]))
    out.values["probe"] = probe


def report_sync(report: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a report that becomes ``status.sync``."""
    return {key: report[key] for key in contract.SYNC_STATUS_KEYS if key in report}


SYNC_ATTEMPTS_FIELD = "attempts"
"""``status.sync.attempts``: each attempt's checks (:func:`ddp_operator.observe.progress.attempt_checks`),
of which ``status.sync``'s checks, mismatches and repairs are the sum: the whole job, every attempt and
world."""


def job_sync(sync: Mapping[str, Any], report: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """``status.sync`` with ``attempt``'s checks as its ``report`` tells them (its earlier worlds' too)
    in ``attempts``, and the counts over every attempt: a new attempt's report no longer replaces the
    earlier attempts' checks. Verified: the report's verdict, with every mismatch of the job repaired."""
    out = dict(sync)
    attempts = with_attempt(sync.get(SYNC_ATTEMPTS_FIELD), attempt_checks(report, attempt))
    if not attempts:
        return out
    totals = job_checks(attempts)
    out.update(totals)
    out[SYNC_ATTEMPTS_FIELD] = attempts
    if "verified" in out:
        out["verified"] = bool(out["verified"]) and totals["mismatches"] <= totals["repairs"]
    return out


def _earlier_attempts(sync: Mapping[str, Any], attempt: int) -> dict[str, int]:
    """The checks, mismatches and repairs of the attempts before ``attempt``."""
    kept = sync.get(SYNC_ATTEMPTS_FIELD)
    return job_checks(
        [a for a in kept if isinstance(a, Mapping) and count(a.get("attempt")) < attempt]
        if isinstance(kept, list)
        else []
    )


LAST_FAILURES = 16
"""Failed ranks ``status.lastReport.failures`` keeps (the earliest first)."""


def last_report(report: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """What ``status.lastReport`` keeps of a report: enough to decide after the pod is gone."""
    kept = {key: report[key] for key in ("result", "reason") if key in report}
    out = {"attempt": attempt, **kept, "message": str(report.get("message", ""))[:1024]}
    if entries := [f for f in report.get("failures") or [] if isinstance(f, Mapping)][:LAST_FAILURES]:
        # who failed first must survive the pods' deletion (failures.describe reads them back)
        fields = (("rank", int), ("at", float), ("restart", int))
        out["failures"] = [
            {k: kind(f[k]) for k, kind in fields if isinstance(f.get(k), int | float)}
            | {"error": str(f.get("error", ""))[:512]}
            for f in entries
        ]
    return out


def report_checkpoint(report: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a report that becomes ``status.checkpoint``."""
    out: dict[str, Any] = {}
    if "resumedFromStep" in report:
        out["resumedFromStep"] = report["resumedFromStep"]
    if report.get("warmStartedFrom"):
        out["warmStartedFrom"] = report["warmStartedFrom"]
    if report.get("skippedCheckpoints"):
        out["skipped"] = list(report["skippedCheckpoints"])[:16]
    return out


def durable_condition(out: StatusBuilder, spec: Spec) -> None:
    s3 = spec.checkpoint.s3 if spec.checkpoint else None
    if s3 is not None:
        message = f"checkpoints go to object storage ({s3.url}): restarts resume"
        out.condition(reasons.CHECKPOINTS_DURABLE, True, "ObjectStorage", message)
    elif checkpoints_durable(spec):
        out.condition(
            reasons.CHECKPOINTS_DURABLE, True, "Volume", "checkpoints outlive the pods: restarts resume"
        )
    elif spec.max_restarts > 0:
        message = (
            "checkpoints go to a pod-local emptyDir: restarts will start from step 0 "
            "(set spec.checkpoint.volumeClaimTemplate or spec.checkpoint.volume)"
        )
        out.condition(reasons.CHECKPOINTS_DURABLE, False, "EmptyDir", message)
    else:
        out.condition(
            reasons.CHECKPOINTS_DURABLE, False, "EmptyDir", "checkpoints go to a pod-local emptyDir"
        )


def checkpoint_events(out: StatusBuilder, report: Mapping[str, Any] | None) -> None:
    """Say what the attempt restored when it was not simply its own newest checkpoint (once per attempt)."""
    if report is None:
        return
    if report.get("warmStartedFrom"):
        source = report["warmStartedFrom"]
        message = f"warm start: the weights of {source} seeded this job (spec.checkpoint.warmStartFrom)"
        out.events.append(Event("Normal", "WarmStarted", message))
    for skipped in list(report.get("skippedCheckpoints") or [])[:4]:
        out.events.append(Event("Warning", "CheckpointSkipped", str(skipped)))


# -- an end -------------------------------------------------------------------------------------------


def keep_finished(out: StatusBuilder) -> None:
    """A terminal phase sticks, and the conditions written with it."""
    out.values["phase"] = out.previous["phase"]
    out.conditions.update({c["type"]: dict(c) for c in out.previous.get("conditions", []) or []})


def finish(out: StatusBuilder, succeeded: bool, reason: str, message: str) -> None:
    """The terminal phase, its completionTime and its Complete or Failed condition."""
    phase = "Succeeded" if succeeded else "Failed"
    out.values["completionTime"] = out.values.get("completionTime") or out.now
    out.phase(phase, reason, message, warning=not succeeded)
    out.condition(reasons.READY, False, reason, message)
    out.condition("Complete" if succeeded else "Failed", True, reason, message)
    sync_condition(out)


def sync_condition(out: StatusBuilder) -> None:
    sync = out.values.get("sync")
    last = out.values.get("lastReport") or {}
    if not sync and last.get("reason") in contract.NOTHING_TO_COMPARE:
        out.condition(reasons.SYNC_VERIFIED, None, str(last["reason"]), str(last.get("message", "")))
    elif not sync and last.get("reason") == contract.SYNC_HOOK_OFF:
        out.condition(reasons.SYNC_VERIFIED, None, contract.SYNC_HOOK_OFF, str(last.get("message", "")))
    elif not sync:
        message = "no sync check reported yet (read from the pods' metrics, and rank 0's final report)"
        out.condition(reasons.SYNC_VERIFIED, None, "NotYetReported", message)
    elif sync.get("verified"):
        attempts = sync.get(SYNC_ATTEMPTS_FIELD)
        over = f" over {len(attempts)} attempts" if isinstance(attempts, list) and len(attempts) > 1 else ""
        out.condition(
            reasons.SYNC_VERIFIED,
            True,
            "BitIdentical",
            f"{sync.get('mismatches', 0)} of {sync.get('checks', 0)} checks found ranks differing; "
            f"{sync['repairs']} repair(s) re-broadcast rank 0's model and the last check found every rank "
            "bit-identical"
            if sync.get("repairs")
            else f"{sync.get('checks', 0)} checks{over} found every rank bit-identical",
        )
    else:
        out.condition(
            reasons.SYNC_VERIFIED,
            False,
            "Diverged",
            f"{sync.get('mismatches', 0)} of {sync.get('checks', 0)} checks found ranks differing",
        )


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
    out = {**(kept if isinstance(kept, dict) else {}), "step": step, "totalSteps": total_steps or step}
    out.update(percent=percent, summary=f"{percent}%", etaSeconds=0, eta="0s", computedAt=now)
    out.pop("etaTime", None)
    out.pop("unreachable", None)
    return out


# -- a running attempt's readings ---------------------------------------------------------------------


def write_reading(out: StatusBuilder, snapshot: Snapshot | None, attempt: int, total_steps: int) -> None:
    """Write a fresh reading into the status, at most every :data:`STATUS_SECONDS`; keep the last one
    otherwise. Posts the events of what changed since."""
    previous = out.previous
    kept = previous.get("progress")
    if isinstance(kept, dict):
        out.values["progress"] = dict(kept)
    old_condition = {c.get("type"): c for c in previous.get("conditions", []) or []}.get(METRICS_SCRAPED)
    if old_condition:
        out.conditions[METRICS_SCRAPED] = dict(old_condition)
    if snapshot is None or snapshot.attempt != attempt:
        return
    written = parse_time(kept.get("computedAt")) if isinstance(kept, dict) else None
    if written is not None and snapshot.at - written.timestamp() < STATUS_SECONDS:
        return
    out.values["progress"] = progress_status(snapshot, total_steps)
    _scraped_condition(out, snapshot)
    if snapshot.latest is not None:
        old_sync = out.values.get("sync") or {}
        new_sync = live_sync(old_sync, snapshot.latest, attempt)
        if new_sync:
            out.values["sync"] = new_sync
        out.events.extend(_sync_events(old_sync, new_sync, snapshot.latest))


def progress_status(snapshot: Snapshot, total_steps: int) -> dict[str, Any]:
    """``status.progress`` from a snapshot (only the fields the metrics tell)."""
    out: dict[str, Any] = {"computedAt": stamp(dt.datetime.fromtimestamp(snapshot.at, dt.UTC))}
    if snapshot.refused or snapshot.unreachable:
        pods = [*snapshot.refused, *(u.split(":")[0] for u in snapshot.unreachable)]
        out["unreachable"] = sorted(pods)[:64]
    now = snapshot.latest
    if now is None:
        return out
    total_steps = now.total_steps or total_steps  # the code's own total where it says (a Trainer's max_steps)
    if total_steps:
        percent = min(100, int(100 * now.step / total_steps))
        out.update(step=now.step, totalSteps=total_steps, percent=percent, summary=f"{percent}%")
    else:  # nobody says how many steps there will be: the step, the rates, no percent or ETA
        out.update(step=now.step, summary=f"step {now.step}")
    steps_per_s, samples_per_s = rates(snapshot)
    if samples_per_s is not None:
        out["samplesPerSecond"] = round(samples_per_s, 1)
    if steps_per_s:
        out["stepsPerSecond"] = round(steps_per_s, 3)
    if steps_per_s and total_steps:
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


def live_sync(previous: Mapping[str, Any], now: Progress, attempt: int = 0) -> dict[str, Any]:
    """``status.sync`` while the job runs: the live count of checks (the running world's, after the earlier
    attempts' of ``status.sync.attempts``), the last one's step, time and verdict."""
    checks = now.checks_ok + now.checks_mismatch
    out = dict(previous)
    if not checks:
        return out
    earlier = _earlier_attempts(previous, attempt)
    mismatches, repairs = now.checks_mismatch + earlier["mismatches"], now.repairs + earlier["repairs"]
    out.update(checks=checks + earlier["checks"], mismatches=mismatches, repairs=repairs)
    if now.last_check_ok is not None:
        out["lastCheckResult"] = "BitIdentical" if now.last_check_ok else "Diverged"
        out["verified"] = now.last_check_ok and mismatches <= repairs
    if now.last_check_time is not None:
        out["lastCheckTime"] = stamp(dt.datetime.fromtimestamp(now.last_check_time, dt.UTC))
    if now.last_check_step is not None:
        out["lastCheckStep"] = now.last_check_step
    return out


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
    step = new.get("lastCheckStep", now.step)
    if not old.get("checks") and now.checks_ok and now.last_check_ok:
        message = (
            f"first sync check passed: every rank holds a bit-identical model (step {step})"
            if now.checks_ok == 1
            else f"sync checks pass: every rank holds a bit-identical model ({now.checks_ok} so far, "
            f"the last at step {step})"
        )
        events.append(Event("Normal", reasons.SYNC_VERIFIED, message))
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
        events.append(Event("Warning", reasons.SYNC_DIVERGENCE, message))
    if int(new.get("repairs", 0)) > int(old.get("repairs", 0) or 0):
        message = f"re-broadcast rank 0's model after a divergence ({new['repairs']} repair(s) so far)"
        events.append(Event("Normal", "SyncRepaired", message))
    return events
