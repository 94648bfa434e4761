"""A reconcile's result: the ``Plan`` (status to write, children to create or delete, events to post) and
the ``StatusBuilder`` that assembles its status with stable condition transition times. Pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Target:
    """A pod whose metrics to read: its name, completion index and ``http://<podIP>:<port>/metrics``."""

    pod: str
    index: int
    url: str


@dataclass(frozen=True)
class Scrape:
    """Read these pods' metrics in the background (the job runs); the next reconcile gets the reading."""

    attempt: int
    port: int
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class Plan:
    status: Obj
    create_claim: Obj | None = None  # the checkpoint PersistentVolumeClaim, before the pods that mount it
    create_service: Obj | None = None  # created (or found already there) before create_job
    create_job: Obj | None = None
    delete_jobs: tuple[str, ...] = ()
    abandon_jobs: tuple[str, ...] = ()  # deleted without waiting for pods whose node does not answer
    suspend_job: tuple[str, bool] | None = None
    events: tuple[Event, ...] = ()
    delete_self: bool = False  # ttlSecondsAfterFinished has passed
    scrape: Scrape | None = None  # None: the job does not run; forget its metrics


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
        ready = {c.get("type"): c for c in self.previous.get("conditions", []) or []}.get("Ready", {})
        if self.previous.get("phase") != phase or ready.get("reason") != reason:
            self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def plan(self, **steps: Any) -> Plan:
        status = {**self.values, "conditions": [self.conditions[k] for k in sorted(self.conditions)]}
        return Plan(status, events=tuple(self.events), **steps)
