"""What exists → the DDPJob's status and the next step. Pure: one function of what is observed.

``reconcile`` looks at the DDPJob's spec, its last status and the batch Jobs and pods that carry its label,
and returns a ``Plan``: the status to write, the Job to create or delete, the Job to (un)suspend, and the
events to post. The Kopf handlers only observe and carry plans out, so every branch here is unit-tested
without an API server and proven against one by the cluster tests.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddp_trainer import contract

from . import policy, render
from .spec import Spec

Obj = dict[str, Any]

PHASES = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    status: Obj
    create_service: Obj | None = None  # created (or found already there) before create_job
    create_job: Obj | None = None
    delete_jobs: tuple[str, ...] = ()
    suspend_job: tuple[str, bool] | None = None
    events: tuple[Event, ...] = ()
    delete_self: bool = False  # ttlSecondsAfterFinished has passed


@dataclass(frozen=True)
class Observed:
    spec: Spec
    generation: int
    previous: Mapping[str, Any]
    jobs: Sequence[Mapping[str, Any]]
    pods: Sequence[Mapping[str, Any]]
    now: dt.datetime


def attempt_of(obj: Mapping[str, Any]) -> int:
    try:
        return int(obj.get("metadata", {}).get("labels", {}).get(render.ATTEMPT_LABEL, "0"))
    except ValueError:
        return 0


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in obj.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            found: Mapping[str, Any] = condition
            return found
    return None


def _index(pod: Mapping[str, Any]) -> int:
    try:
        return int(pod["metadata"].get("annotations", {}).get(render.COMPLETION_INDEX_ANNOTATION, "-1"))
    except ValueError:
        return -1


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for status in pod.get("status", {}).get("containerStatuses", []) or []:
        if status.get("name") == render.CONTAINER_NAME:
            state = status.get("state", {}).get("terminated") or status.get("lastState", {}).get("terminated")
            return state if isinstance(state, dict) else None
    return None


def _ready(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") == "Running" and _condition(pod, "Ready") is not None


def _unschedulable(pods: Sequence[Mapping[str, Any]]) -> str | None:
    for pod in pods:
        for condition in pod.get("status", {}).get("conditions", []) or []:
            if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
                "PodScheduled",
                "False",
                "Unschedulable",
            ):
                return str(condition.get("message") or "no node can run this pod")
    return None


def rank0_report(pods: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The trainer's report from the termination message of the pod at completion index 0."""
    for pod in pods:
        if _index(pod) == 0 and (state := _terminated(pod)):
            return dict(report) if (report := contract.parse_report(state.get("message"))) else None
    return None


def outcome(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> policy.Outcome:
    """A finished Job as the policy sees it."""
    codes = {_index(pod): int(state.get("exitCode", 0)) for pod in pods if (state := _terminated(pod))}
    failed = _condition(job, "Failed")
    reason = str(failed.get("reason", "")) if failed else ""
    culprits = [f"node {i} exited {code}" for i, code in sorted(codes.items()) if code]
    message = ", ".join(culprits) or (str(failed.get("message", "")) if failed else "")
    return policy.Outcome(
        succeeded=_condition(job, "Complete") is not None,
        exit_codes=codes,
        report=rank0_report(pods),
        reason="DeadlineExceeded" if reason == "DeadlineExceeded" else "",
        message=message,
    )


def _stamp(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass
class _Status:
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
        ready = {c.get("type"): c for c in self.previous.get("conditions", []) or []}.get("Ready", {})
        if self.previous.get("phase") != phase or ready.get("reason") != reason:
            self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def build(self) -> Obj:
        return {**self.values, "conditions": [self.conditions[k] for k in sorted(self.conditions)]}


def reconcile(observed: Observed) -> Plan:
    """The status to write and the next step, from what exists now."""
    spec, previous = observed.spec, observed.previous
    first = contract.FIRST_ATTEMPT
    attempt = max([int(previous.get("attempt") or first), *map(attempt_of, observed.jobs)])
    restarts = contract.restarts_before(attempt)  # derived from the attempt, never counted apart
    now = _stamp(observed.now)
    out = _Status(previous, now)
    start = previous.get("startTime") or now
    out.values.update(
        attempt=attempt,
        restarts=restarts,
        observedGeneration=observed.generation,
        startTime=start,
        readyNodes=0,
    )
    if previous.get("completionTime"):
        out.values["completionTime"] = previous["completionTime"]
    if isinstance(previous.get("sync"), dict):
        out.values["sync"] = dict(previous["sync"])

    current = [job for job in observed.jobs if attempt_of(job) == attempt]
    stale = tuple(job["metadata"]["name"] for job in observed.jobs if attempt_of(job) < attempt)
    pods = [pod for pod in observed.pods if attempt_of(pod) == attempt]
    report = rank0_report(pods)
    if report is not None:
        out.values["sync"] = contract.sync_status(report)

    if previous.get("phase") in TERMINAL:
        out.values["phase"] = previous["phase"]
        out.conditions.update({c["type"]: dict(c) for c in previous.get("conditions", []) or []})
        finished = _parse_time(previous.get("completionTime"))
        ttl = spec.ttl_seconds_after_finished
        expired = (
            ttl is not None and finished is not None and (observed.now - finished).total_seconds() >= ttl
        )
        return Plan(out.build(), delete_jobs=stale, delete_self=expired)

    deadline = spec.active_deadline_seconds
    started = _parse_time(start)
    if deadline is not None and started and (observed.now - started).total_seconds() > deadline:
        return _finish(
            out,
            False,
            "DeadlineExceeded",
            f"ran longer than activeDeadlineSeconds ({deadline}s), restarts included",
            delete=stale + tuple(job["metadata"]["name"] for job in current),
        )

    if stale:
        out.phase("Restarting", "GangRestart", f"stopping the pods of attempt(s) before {attempt}")
        out.condition("Ready", False, "GangRestart", "waiting for the pods of earlier attempts to go away")
        return Plan(out.build(), delete_jobs=stale, events=tuple(out.events))

    if not current:
        job = render.render_job(spec, attempt)
        out.phase(
            "Suspended" if spec.suspend else "Pending",
            "Created" if not spec.suspend else "Suspended",
            f"created Job {job['metadata']['name']} (attempt {attempt})",
        )
        out.condition("Ready", False, "Creating", f"creating attempt {attempt}")
        return Plan(
            out.build(), create_service=render.render_service(spec), create_job=job, events=tuple(out.events)
        )

    existing = current[0]
    name = existing["metadata"]["name"]
    if _condition(existing, "Complete"):
        return _finish(out, True, "Completed", f"attempt {attempt} completed")
    if _condition(existing, "Failed"):
        decision = policy.decide(outcome(existing, pods), attempt, spec.max_restarts)
        if decision.action is policy.Action.RESTART:
            out.values.update(attempt=attempt + 1, restarts=contract.restarts_before(attempt + 1))
            out.phase("Restarting", decision.reason, decision.message, warning=True)
            out.condition("Ready", False, decision.reason, decision.message)
            return Plan(out.build(), delete_jobs=(name,), events=tuple(out.events))
        return _finish(out, False, decision.reason, decision.message)

    suspended = bool(existing.get("spec", {}).get("suspend"))
    toggle = None
    if spec.suspend and not suspended:
        toggle = (name, True)
    elif not spec.suspend and suspended and spec.queue_name is None:
        toggle = (name, False)
    ready = sum(1 for pod in pods if _ready(pod))
    out.values["readyNodes"] = ready
    if spec.suspend:
        out.phase("Suspended", "Suspended", "suspended: the pods are stopped and the checkpoint is kept")
        out.condition("Ready", False, "Suspended", "spec.suspend is true")
    elif suspended:
        out.phase("Pending", "Queued", f"waiting for Kueue queue {spec.queue_name} to admit the gang")
        out.condition("Ready", False, "Queued", f"Job {name} is suspended until Kueue admits it")
    elif ready == spec.nodes:
        out.phase("Running", "AllNodesReady", f"all {spec.nodes} pods of attempt {attempt} are running")
        out.condition("Ready", True, "AllNodesReady", f"{ready}/{spec.nodes} pods ready")
    elif why := _unschedulable(pods):
        out.phase("Pending", "Unschedulable", f"pods cannot be scheduled: {why}", warning=True)
        out.condition("Ready", False, "Unschedulable", f"{ready}/{spec.nodes} pods ready; {why}")
    else:
        out.phase("Pending", "Starting", f"starting {spec.nodes} pods of attempt {attempt}")
        out.condition("Ready", False, "Starting", f"{ready}/{spec.nodes} pods ready")
    _sync_condition(out, report)
    return Plan(out.build(), suspend_job=toggle, events=tuple(out.events))


def _finish(out: _Status, succeeded: bool, reason: str, message: str, delete: tuple[str, ...] = ()) -> Plan:
    phase = "Succeeded" if succeeded else "Failed"
    out.values["completionTime"] = out.values.get("completionTime") or out.now
    out.phase(phase, reason, message, warning=not succeeded)
    out.condition("Ready", False, reason, message)
    out.condition("Complete" if succeeded else "Failed", True, reason, message)
    _sync_condition(out, None)
    return Plan(out.build(), delete_jobs=delete, events=tuple(out.events))


def _sync_condition(out: _Status, report: Mapping[str, Any] | None) -> None:
    sync = out.values.get("sync") or report
    if not sync:
        out.condition("SyncVerified", None, "NotYetReported", "the trainer reports at the end of an attempt")
    elif sync.get("verified"):
        out.condition(
            "SyncVerified",
            True,
            "BitIdentical",
            f"{sync.get('checks', 0)} checks found every rank bit-identical",
        )
    else:
        out.condition(
            "SyncVerified",
            False,
            "Diverged",
            f"{sync.get('mismatches', 0)} of {sync.get('checks', 0)} checks found ranks differing",
        )
